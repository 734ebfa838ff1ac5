package wireguard

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Key rotation happens in two steps so that it never cuts traffic by
// itself: PrepareRotation makes the next key and publishes its public half
// (wireguard.pub, what the peers file or NodeConfig carries) while the
// device keeps the current key; once the node's own entry in the peer set
// carries the next public key, every peer is being told at the same moment,
// and the device switches (CommitRotation). A rotation whose key is never
// distributed stays pending, harmlessly.
const (
	// NextPrivateKeyFile holds the pending key during a rotation (0600).
	NextPrivateKeyFile = "wireguard.key.next"
	// RotateTriggerFile asks for a rotation: create it in the state dir
	// (touch); the daemon removes it when the next key is ready.
	RotateTriggerFile = "wireguard.rotate"
)

// PrepareRotation returns the pending next key, generating and storing it
// (0600, atomically) unless one exists, and publishes its public half.
func PrepareRotation(stateDir string) (wgtypes.Key, error) {
	if k, ok, err := LoadNextKey(stateDir); err != nil || ok {
		return k, err
	}
	return createKey(stateDir, filepath.Join(stateDir, NextPrivateKeyFile))
}

// LoadNextKey returns the pending key of a rotation, if any.
func LoadNextKey(stateDir string) (wgtypes.Key, bool, error) {
	path := filepath.Join(stateDir, NextPrivateKeyFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return wgtypes.Key{}, false, nil
	}
	if err != nil {
		return wgtypes.Key{}, false, err
	}
	k, err := parseKey(path, data)
	return k, err == nil, err
}

// CommitRotation makes the pending key the node's key (one rename: a crash
// leaves either the old key with the rotation pending, or the new one).
func CommitRotation(stateDir string) error {
	return os.Rename(filepath.Join(stateDir, NextPrivateKeyFile), filepath.Join(stateDir, PrivateKeyFile))
}
