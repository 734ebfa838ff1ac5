package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/coordino/coordino/daemon/atomicfile"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Key file names in the state dir.
const (
	PrivateKeyFile = "wireguard.key"
	PublicKeyFile  = "wireguard.pub"
)

// LoadOrCreateKey returns the node's private key, generating it at first
// start. The key is written to a temporary 0600 file and renamed, so a
// crash never leaves a truncated key. The public key is written next to it
// for the operator to distribute.
func LoadOrCreateKey(stateDir string) (wgtypes.Key, error) {
	path := filepath.Join(stateDir, PrivateKeyFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		fi, err := os.Stat(path)
		if err != nil {
			return wgtypes.Key{}, err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return wgtypes.Key{}, fmt.Errorf("%s is readable by others (mode %v): want 0600", path, fi.Mode().Perm())
		}
		k, err := parseKey(path, data)
		if err != nil {
			return wgtypes.Key{}, err
		}
		// During a rotation the published key is the pending one.
		if next, ok, err := LoadNextKey(stateDir); err != nil {
			return wgtypes.Key{}, err
		} else if ok {
			return k, writePublic(stateDir, next)
		}
		return k, writePublic(stateDir, k)
	case !errors.Is(err, fs.ErrNotExist):
		return wgtypes.Key{}, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return wgtypes.Key{}, err
	}
	return createKey(stateDir, path)
}

// createKey generates a private key, writes it to path (0600, atomically)
// and publishes its public half.
func createKey(stateDir, path string) (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, err
	}
	if err := atomicfile.Write(path, []byte(k.String()+"\n"), 0o600); err != nil {
		return wgtypes.Key{}, err
	}
	return k, writePublic(stateDir, k)
}

func writePublic(stateDir string, k wgtypes.Key) error {
	return atomicfile.Write(filepath.Join(stateDir, PublicKeyFile), []byte(k.PublicKey().String()+"\n"), 0o644)
}

// parseKey parses a key file's content without ever echoing it: it is a
// secret.
func parseKey(path string, data []byte) (wgtypes.Key, error) {
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(data)))
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("%s does not hold a WireGuard private key", path)
	}
	return k, nil
}
