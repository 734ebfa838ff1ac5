package controlplane

import (
	"os"
	"syscall"
)

// fileStamp identifies one version of a file without reading it: a rename
// changes the inode, an in-place write the change time.
type fileStamp struct {
	ino, size    int64
	mtime, ctime int64
}

func stampOf(st os.FileInfo) fileStamp {
	fs := fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fs.ino = int64(sys.Ino)
		fs.ctime = sys.Ctim.Nano()
	}
	return fs
}
