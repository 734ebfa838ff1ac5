// Package conflist builds, parses, validates and edits CNI network
// configuration files (.conf, .conflist, .json) without losing anything it
// does not own: unknown keys, plugin order and the text of every value survive
// a round trip. It is the only code in Coordino that edits CNI configs.
package conflist
