//go:build !linux

package controlplane

import "os"

// fileStamp identifies one version of a file without reading it.
type fileStamp struct {
	size, mtime int64
}

func stampOf(st os.FileInfo) fileStamp {
	return fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano()}
}
