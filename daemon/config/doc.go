// Package config reads the daemon's options from flags and an optional JSON
// config file with the same keys (flags win), and validates them.
package config
