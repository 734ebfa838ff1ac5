// Command coordino is the Coordino CNI plugin binary. Its file name is its CNI type.
package main

import "github.com/coordino/coordino/plugin"

func main() { plugin.Main() }
