package e2e

import (
	"testing"

	"github.com/coordino/coordino/test/harness"
)

func TestSmokeAddDel(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.77.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	p := newPod(t, "p1")
	rt := harness.RuntimeConf(p, "eth0")
	res, err := c.Add(ctx(t), rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(harness.ResultJSON(res))
	if err := c.Check(ctx(t), rt); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx(t), rt); err != nil {
		t.Fatal(err)
	}
}
