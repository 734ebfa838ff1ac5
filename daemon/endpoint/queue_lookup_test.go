package endpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/proto/cni/v1/wire"
	"github.com/coordino/coordino/proto/deletequeue"
)

// An ADD applies the queued DELs of its own attachment first. It used to
// read and parse every queued DEL to find them, so each ADD cost O(backlog)
// file reads while a daemon restart left many DELs queued. The kernel tells
// which files the lookup opens (inotify): none of another attachment's.
func TestAddLooksUpOnlyItsOwnQueuedDels(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	queue := filepath.Join(t.TempDir(), "queue")
	const network = "queue-lookup"
	conf := []byte(`{"cniVersion":"1.1.0","name":"` + network + `","type":"coordino"}`)
	mine := store.Key{Network: network, ContainerID: "mine", IfName: "eth0"}
	if err := st.Put(&store.Endpoint{Key: mine, Mode: store.ModeChained, Netns: "/proc/self/ns/net", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := deletequeue.Write(queue, &wire.Request{ContainerID: fmt.Sprintf("other-%d", i), IfName: "eth0", Stdin: conf}); err != nil {
			t.Fatal(err)
		}
	}
	if err := deletequeue.Write(queue, &wire.Request{ContainerID: mine.ContainerID, IfName: mine.IfName, Stdin: conf}); err != nil {
		t.Fatal(err)
	}

	// Every entry and every directory of the queue, and whose entry each is.
	others, dirs := map[string]bool{}, []string{}
	mineEntry := ""
	err = filepath.WalkDir(queue, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		req, _, err := deletequeue.Decode(p, data)
		if err != nil {
			return err
		}
		if req.ContainerID == mine.ContainerID {
			mineEntry = p
		} else {
			others[p] = true
		}
		return nil
	})
	if err != nil || mineEntry == "" || len(others) != 40 {
		t.Fatalf("queue as written: mine %q, %d others, %v", mineEntry, len(others), err)
	}

	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	dirOf := map[int32]string{}
	for _, d := range dirs {
		wd, err := unix.InotifyAddWatch(in, d, unix.IN_OPEN|unix.IN_ACCESS)
		if err != nil {
			t.Fatal(err)
		}
		dirOf[int32(wd)] = d
	}

	m := New(Config{Store: st, Network: newFakeNode(), DeleteQueueDir: queue})
	unlock := m.lockKey(mine)
	err = m.applyQueuedDels(context.Background(), mine)
	unlock()
	if err != nil {
		t.Fatal(err)
	}

	touched := map[string]bool{}
	buf := make([]byte, 1<<16)
	for {
		n, err := unix.Read(in, buf)
		if n <= 0 || err != nil {
			break
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen], "\x00"))
			touched[filepath.Join(dirOf[wd], name)] = true
			off += unix.SizeofInotifyEvent + nameLen
		}
	}
	var read int
	for p := range others {
		if touched[p] || (filepath.Dir(p) != queue && touched[filepath.Dir(p)]) {
			read++
		}
	}
	if read > 0 {
		t.Errorf("the ADD's lookup of its own queued DELs opened %d of the %d entries (or their directories) of other attachments", read, len(others))
	}
	if _, err := st.Get(mine); err == nil {
		t.Error("the queued DEL of the ADD's attachment was not applied")
	}
	if _, err := os.Lstat(mineEntry); err == nil {
		t.Error("the applied queued DEL is still queued")
	}
	for p := range others {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("another attachment's queued DEL went: %v", err)
		}
	}
}
