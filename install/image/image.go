package image

import (
	"path/filepath"

	"github.com/coordino/coordino/test/testbed/images/ociimage"
)

// DefaultRef is the name `make image` tags and the manifests reference
// (install/kubernetes/base: images: coordino -> coordino/coordino:dev).
const DefaultRef = "coordino/coordino:dev"

// Binary is one binary of `make build` (or `make ref-plugins`) and its path
// in the image.
type Binary struct {
	Name string // file name under bin/
	Path string // absolute path in the image
}

// Contents lists what the image holds: every binary of `make build` and the
// reference portmap plugin, which the primary conflist chains for hostPorts.
// The plugins sit outside PATH, only for coordino-install to copy to the host;
// coordino-wireguard must sit next to coordino-daemon, which starts it from
// its own directory.
var Contents = []Binary{
	{"coordino", "/opt/coordino/bin/coordino"},
	{"ref/portmap", "/opt/coordino/bin/portmap"},
	{"coordino-daemon", "/usr/local/bin/coordino-daemon"},
	{"coordino-wireguard", "/usr/local/bin/coordino-wireguard"},
	{"coordino-install", "/usr/local/bin/coordino-install"},
	{"coordino-controller", "/usr/local/bin/coordino-controller"},
	{"coordinoctl", "/usr/local/bin/coordinoctl"},
}

// Symlinks are the links the image holds. Runtimes hand the daemon
// CNI_NETNS paths under /var/run/netns (containerd's and CRI-O's default);
// the DaemonSet mounts the host's /run/netns, so /var/run must lead to /run as
// on the host.
var Symlinks = []ociimage.Symlink{{Path: "/var/run", Target: "../run"}}

// Entrypoint is the image's default command; the manifests set each
// container's command explicitly.
var Entrypoint = []string{"/usr/local/bin/coordino-daemon"}

// Build packs the binaries in binDir into a docker-archive at out, tagged
// ref, with version in the OCI version label.
func Build(binDir, ref, version, out string) error {
	spec := ociimage.Spec{
		Entrypoint: Entrypoint,
		Symlinks:   Symlinks,
		Labels: map[string]string{
			"org.opencontainers.image.title":       "coordino",
			"org.opencontainers.image.description": "Coordino CNI: plugin, node daemon, installer and controller",
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.source":      "https://github.com/coordino/coordino",
		},
	}
	for _, b := range Contents {
		spec.Files = append(spec.Files, ociimage.File{Src: filepath.Join(binDir, b.Name), Dst: b.Path})
	}
	img, err := ociimage.Build(spec)
	if err != nil {
		return err
	}
	return ociimage.WriteArchive(out, ref, img)
}
