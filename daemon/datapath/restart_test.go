package datapath

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRestartNoPolicyGap restarts the datapath as the daemon does (Close,
// Open adopting the pins and re-pointing the links at the programs, the
// first snapshot, the endpoints re-attached) a few times while a pod that
// policy denies opens new UDP flows to an isolated pod without pause: not
// one datagram may arrive, at any step.
func TestRestartNoPolicyGap(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t, m.attach)
			c.policies(serverIngress)
			const port = 82 // served by no pod: only this test's sink
			const restarts = 3
			dst := netip.AddrPortFrom(c.pods["b"].IP, port)
			var sink net.PacketConn
			if err := c.pods["b"].Do(func() (err error) { sink, err = net.ListenPacket("udp4", dst.String()); return err }); err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			var got atomic.Int64
			go func() {
				buf := make([]byte, 64)
				for {
					if _, _, err := sink.ReadFrom(buf); err != nil {
						return
					}
					got.Add(1)
				}
			}()
			// New sockets keep coming, so every datagram is a new flow.
			stop := make(chan struct{})
			var sent atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = c.pods["c"].Do(func() error {
						for range 32 {
							conn, err := net.Dial("udp4", dst.String())
							if err != nil {
								return err
							}
							for range 4 {
								if _, err := conn.Write([]byte("denied")); err == nil {
									sent.Add(1)
								}
							}
							conn.Close()
						}
						return nil
					})
				}
			}()
			for range restarts {
				if err := c.dp.Close(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
				c.open()
				time.Sleep(20 * time.Millisecond)
				c.policies(serverIngress)
				for _, name := range []string{"a", "b", "c"} {
					if err := c.dp.AttachEndpoint(c.eps[name]); err != nil {
						t.Fatalf("re-attach %s: %v", name, err)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			time.Sleep(100 * time.Millisecond)
			t.Logf("%d denied datagrams sent, %d arrived", sent.Load(), got.Load())
			if got.Load() > 0 {
				t.Fatalf("%d of %d denied datagrams arrived across restarts", got.Load(), sent.Load())
			}
		})
	}
}
