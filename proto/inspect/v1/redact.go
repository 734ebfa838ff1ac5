package inspectv1

import (
	"regexp"
)

// Redacted replaces every secret Redact removes.
const Redacted = "[REDACTED]"

var (
	// "privateKey": "…", private_key=…, token: …, password … (JSON, YAML,
	// key=value, wg-quick ini).
	secretField = regexp.MustCompile(`(?i)("?(?:private[_-]?key|preshared[_-]?key|token|bearer[_-]?token|password|secret|client[_-]?key[_-]?data)"?\s*[:=]\s*)("[^"]*"|[^\s,}\]]+)`)
	// Authorization: Bearer …
	bearer = regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}`)
	// WireGuard keys are 32 bytes of base64 (44 characters ending in "="),
	// whatever field they sit in; the first group is set when the field is
	// named as a public one ("publicKey": …, public key: …, peer: … as wg
	// show prints them).
	wireguardKey = regexp.MustCompile(`((?i)"?(?:public[ _-]?key|peer)"?\s*[:=]\s*"?)?[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=`)
	// JSON web tokens (service-account tokens).
	jwt = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}`)
)

// Redact removes secrets from a diagnostic file: values of fields named like
// private keys, tokens or passwords, bearer credentials, anything shaped
// like a WireGuard key unless its field names it a public key, and JSON web
// tokens. Public keys stay because comparing them across nodes is how a
// broken tunnel is diagnosed (docs/operations.md); they are public by
// design. The daemon and coordinoctl pass every file of a bug report
// through it.
func Redact(b []byte) []byte {
	b = secretField.ReplaceAll(b, []byte("${1}\""+Redacted+"\""))
	b = bearer.ReplaceAll(b, []byte("${1}"+Redacted))
	b = wireguardKey.ReplaceAllFunc(b, func(m []byte) []byte {
		if wireguardKey.FindSubmatchIndex(m)[2] >= 0 {
			return m // a public key
		}
		return []byte(Redacted)
	})
	return jwt.ReplaceAll(b, []byte(Redacted))
}
