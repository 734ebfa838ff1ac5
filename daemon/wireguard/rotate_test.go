package wireguard

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRotationFiles: a prepared rotation publishes the next key, survives a
// restart (LoadOrCreateKey keeps the old key in use, still publishing the
// next one) and is committed by one rename.
func TestRotationFiles(t *testing.T) {
	dir := t.TempDir()
	old, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	next, err := PrepareRotation(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := PrepareRotation(dir); again != next {
		t.Fatal("a second request made another key instead of keeping the pending one")
	}
	published := func() string {
		data, _ := os.ReadFile(filepath.Join(dir, PublicKeyFile))
		return strings.TrimSpace(string(data))
	}
	if published() != next.PublicKey().String() {
		t.Fatal("the pending key is not published")
	}
	if fi, err := os.Stat(filepath.Join(dir, NextPrivateKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pending key file: %v %v", err, fi)
	}
	if k, err := LoadOrCreateKey(dir); err != nil || k != old || published() != next.PublicKey().String() {
		t.Fatalf("restart during the rotation: key changed %v, published %s, err %v", k != old, published(), err)
	}
	if err := CommitRotation(dir); err != nil {
		t.Fatal(err)
	}
	if k, err := LoadOrCreateKey(dir); err != nil || k != next {
		t.Fatalf("after commit: %v", err)
	}
	if _, ok, _ := LoadNextKey(dir); ok {
		t.Fatal("pending key left after commit")
	}
	if err := os.WriteFile(filepath.Join(dir, NextPrivateKeyFile), []byte("secret-garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadNextKey(dir); err == nil || strings.Contains(err.Error(), "secret-garbage") {
		t.Fatalf("a damaged pending key: %v", err)
	}
}
