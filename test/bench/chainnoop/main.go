package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

func main() {
	switch os.Getenv("CNI_COMMAND") {
	case "ADD":
		in, err := io.ReadAll(os.Stdin)
		if err != nil {
			fail(err)
		}
		var conf struct {
			PrevResult json.RawMessage `json:"prevResult"`
		}
		if err := json.Unmarshal(in, &conf); err != nil {
			fail(err)
		}
		if len(conf.PrevResult) == 0 {
			fail(fmt.Errorf("prevResult is missing: chainnoop runs only after another plugin"))
		}
		_, _ = os.Stdout.Write(conf.PrevResult)
	case "VERSION":
		_, _ = os.Stdout.WriteString(`{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}`)
	}
	// DEL, CHECK, GC, STATUS: nothing to do.
}

func fail(err error) {
	_, _ = fmt.Fprintf(os.Stdout, `{"cniVersion":"1.1.0","code":999,"msg":%q}`, err.Error())
	os.Exit(1)
}
