package wireguard

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeyCreatedOnceWithPrivateMode(t *testing.T) {
	dir := t.TempDir()
	k1, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, PrivateKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode %v, want 0600", fi.Mode().Perm())
	}
	k2, err := LoadOrCreateKey(dir)
	if err != nil || k1 != k2 {
		t.Fatalf("second start: key changed (%v)", err)
	}
	pub, _ := os.ReadFile(filepath.Join(dir, PublicKeyFile))
	if strings.TrimSpace(string(pub)) != k1.PublicKey().String() {
		t.Fatalf("public key file %q does not match", pub)
	}
	if err := os.Chmod(filepath.Join(dir, PrivateKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil || !strings.Contains(err.Error(), "0600") {
		t.Fatalf("world-readable key accepted: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, PrivateKeyFile), []byte("secret-garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil || strings.Contains(err.Error(), "secret-garbage") {
		t.Fatalf("bad key: got %v; the error must not echo the file", err)
	}
}
