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
	// whatever field they sit in.
	wireguardKey = regexp.MustCompile(`[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=`)
	// JSON web tokens (service-account tokens).
	jwt = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}`)
)

// Redact removes secrets from a diagnostic file: values of fields named like
// keys, tokens or passwords, bearer credentials, anything shaped like a
// WireGuard key (public keys too: one rule, no guessing) and JSON web
// tokens. The daemon and coordinoctl pass every file of a bug report
// through it.
func Redact(b []byte) []byte {
	b = secretField.ReplaceAll(b, []byte("${1}\""+Redacted+"\""))
	b = bearer.ReplaceAll(b, []byte("${1}"+Redacted))
	b = wireguardKey.ReplaceAll(b, []byte(Redacted))
	return jwt.ReplaceAll(b, []byte(Redacted))
}
