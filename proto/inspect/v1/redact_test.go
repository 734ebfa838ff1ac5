package inspectv1

import (
	"strings"
	"testing"
)

func TestRedactRemovesSecrets(t *testing.T) {
	const wgKey = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	const token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXZhbHVl"
	in := strings.Join([]string{
		`{"privateKey":"` + wgKey + `","listenPort":51820}`,
		`PrivateKey = ` + wgKey,
		`token: s3cr3t-token-value`,
		`Authorization: Bearer abcdefghijklmnop`,
		`{"level":"info","msg":"peer","key":"` + wgKey + `"}`,
		`kubeconfig user token ` + token,
		`password=hunter2hunter2`,
	}, "\n")
	out := string(Redact([]byte(in)))
	for _, secret := range []string{wgKey, token, "s3cr3t-token-value", "abcdefghijklmnop", "hunter2hunter2"} {
		if strings.Contains(out, secret) {
			t.Errorf("secret %q survived redaction:\n%s", secret, out)
		}
	}
	for _, keep := range []string{`"listenPort":51820`, `"level":"info"`, "kubeconfig user token"} {
		if !strings.Contains(out, keep) {
			t.Errorf("redaction removed %q:\n%s", keep, out)
		}
	}
}

// Public keys are what docs/operations.md asks users to compare between
// nodes: a bug report keeps them, however they are written.
func TestRedactKeepsPublicKeys(t *testing.T) {
	const pub = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
	const priv = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	in := strings.Join([]string{
		`{"publicKey": "` + pub + `", "privateKey": "` + priv + `"}`,
		`{"level":"info","msg":"wireguard device ready","publicKey":"` + pub + `"}`,
		`  public key: ` + pub,
		`peer: ` + pub,
		`PublicKey = ` + pub,
		`public_key=` + pub,
		`unnamed ` + priv,
	}, "\n")
	out := string(Redact([]byte(in)))
	if strings.Contains(out, priv) {
		t.Errorf("private key survived:\n%s", out)
	}
	if n := strings.Count(out, pub); n != 6 {
		t.Errorf("%d of 6 public keys kept:\n%s", n, out)
	}
}

func FuzzRedact(f *testing.F) {
	f.Add([]byte(`{"privateKey":"yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="}`))
	f.Add([]byte("token: x\nBearer abcdefgh12345"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := Redact(b)
		if again := Redact(out); string(again) != string(out) {
			t.Fatalf("Redact is not idempotent: %q -> %q", out, again)
		}
	})
}
