package plugin

import (
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
)

// daemonResult is a result as the daemon writes it (encoding/json, 1.1.0).
const daemonResult = `{"cniVersion":"1.1.0","interfaces":[{"name":"cdo1","mac":"aa:bb:cc:dd:ee:ff"},{"name":"eth0","mac":"aa:bb:cc:dd:ee:01","sandbox":"/var/run/netns/x"}],"ips":[{"interface":1,"address":"10.1.0.5/32","gateway":"169.254.1.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}],"dns":{}}`

func printed(t *testing.T, raw, version string) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	err = printResult([]byte(raw), version)
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if err != nil {
		t.Fatalf("printResult(%s): %v", version, err)
	}
	return string(out)
}

func TestPrintResultConvertsOnlyWhenNeeded(t *testing.T) {
	if got := printed(t, daemonResult, "1.1.0"); got != daemonResult {
		t.Fatalf("same version not verbatim: %s", got)
	}
	for _, v := range []string{"1.0.0", "0.4.0", "0.3.1"} {
		var res struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []struct {
				Version string `json:"version"`
				Address string `json:"address"`
			} `json:"ips"`
		}
		out := printed(t, daemonResult, v)
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.CNIVersion != v || len(res.IPs) != 1 || res.IPs[0].Address != "10.1.0.5/32" {
			t.Fatalf("%s: %s (%v)", v, out, err)
		}
		if strings.HasPrefix(v, "0.") && res.IPs[0].Version != "4" {
			t.Fatalf("%s: no ip version field: %s", v, out)
		}
	}
}
