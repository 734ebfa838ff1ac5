package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The monitoring overlay's kinds are Prometheus Operator CRDs, which the
// client-go scheme does not know: these mirror the fields the overlay may
// use, and decoding rejects anything else.
type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type podMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type ruleGroups struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type prometheusRule struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       ruleGroups `json:"spec"`
}

type dashboard struct {
	UID           string   `json:"uid"`
	Title         string   `json:"title"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Timezone      string   `json:"timezone"`
	SchemaVersion int      `json:"schemaVersion"`
	Version       int      `json:"version"`
	Editable      bool     `json:"editable"`
	Refresh       string   `json:"refresh"`
	Time          struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
	Templating struct {
		List []struct {
			Name       string      `json:"name"`
			Label      string      `json:"label"`
			Type       string      `json:"type"`
			Query      string      `json:"query"`
			Datasource *datasource `json:"datasource,omitempty"`
			Multi      bool        `json:"multi,omitempty"`
			IncludeAll bool        `json:"includeAll,omitempty"`
			Refresh    int         `json:"refresh,omitempty"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID          int        `json:"id"`
		Type        string     `json:"type"`
		Title       string     `json:"title"`
		Description string     `json:"description"`
		Datasource  datasource `json:"datasource"`
		GridPos     struct {
			X int `json:"x"`
			Y int `json:"y"`
			W int `json:"w"`
			H int `json:"h"`
		} `json:"gridPos"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
			Overrides []json.RawMessage `json:"overrides"`
		} `json:"fieldConfig"`
		Options struct{} `json:"options"`
		Targets []struct {
			Datasource   datasource `json:"datasource"`
			Expr         string     `json:"expr"`
			LegendFormat string     `json:"legendFormat"`
			RefID        string     `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func strictJSON(t *testing.T, what string, data []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s does not decode strictly: %v", what, err)
	}
}

// promtoolCheckRules runs `promtool check rules` on groups: the PromQL of
// every expression is parsed and the templates of annotations too.
func promtoolCheckRules(t *testing.T, what string, groups ruleGroups) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool missing (Debian package prometheus; hack/deps.sh installs it)")
		}
		t.Logf("promtool missing: %s not checked by promtool", what)
		return
	}
	y, err := yaml.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules (%s): %v\n%s\n%s", what, err, out, y)
	}
}

func TestMonitoringOverlay(t *testing.T) {
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "overlays/monitoring")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var kinds []string
	var promRule *prometheusRule
	var dash *dashboard
	for _, res := range resMap.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		j, err := yaml.YAMLToJSON(y)
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, res.GetKind())
		if res.GetNamespace() != "coordino-system" || res.GetLabels()["app.kubernetes.io/part-of"] != "coordino" {
			t.Errorf("%s: namespace %q labels %v", res.CurId(), res.GetNamespace(), res.GetLabels())
		}
		switch res.GetKind() {
		case "PodMonitor":
			var pm podMonitor
			strictJSON(t, "PodMonitor", j, &pm)
			if pm.APIVersion != "monitoring.coreos.com/v1" || len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port != "metrics" ||
				pm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "coordino" {
				t.Errorf("PodMonitor = %+v", pm)
			}
		case "PrometheusRule":
			promRule = &prometheusRule{}
			strictJSON(t, "PrometheusRule", j, promRule)
		case "ConfigMap":
			obj, _, err := decoder.Decode(j, nil, nil)
			if err != nil {
				t.Fatalf("ConfigMap: %v", err)
			}
			cm := obj.(*corev1.ConfigMap)
			if cm.Labels["grafana_dashboard"] != "1" {
				t.Errorf("dashboard ConfigMap lacks grafana_dashboard=1: %v", cm.Labels)
			}
			dash = &dashboard{}
			strictJSON(t, "dashboard", []byte(cm.Data["coordino-dashboard.json"]), dash)
		default:
			t.Errorf("unexpected kind %s", res.GetKind())
		}
	}
	slices.Sort(kinds)
	if !slices.Equal(kinds, []string{"ConfigMap", "PodMonitor", "PrometheusRule"}) || promRule == nil || dash == nil {
		t.Fatalf("overlay renders %v", kinds)
	}

	// The alerts the operators asked for, each with a summary.
	var alerts []string
	for _, g := range promRule.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
				t.Errorf("alert %s lacks a summary or severity", r.Alert)
			}
		}
	}
	for _, want := range []string{"CoordinoBPFMapPressure", "CoordinoIPAMPoolNearExhaustion", "CoordinoDeleteQueueNotDraining", "CoordinoCNIAddErrorsRising"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s (have %v)", want, alerts)
		}
	}
	promtoolCheckRules(t, "PrometheusRule", promRule.Spec)

	// Dashboard: unique panel ids, no overlapping panels, every query parses
	// (checked as recording rules with the template variables filled in).
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]int{}
	queries := ruleGroup{Name: "dashboard"}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 || len(p.Targets) == 0 {
			t.Errorf("panel %q: grid %+v targets %d", p.Title, p.GridPos, len(p.Targets))
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Fatalf("panels %d and %d overlap", other, p.ID)
				}
				used[cell{x, y}] = p.ID
			}
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %+v", p.Title, tg)
			}
			expr := strings.ReplaceAll(tg.Expr, "$instance", ".*")
			queries.Rules = append(queries.Rules, rule{Record: fmt.Sprintf("dashboard:panel%d:%s", p.ID, tg.RefID), Expr: expr})
		}
	}
	promtoolCheckRules(t, "dashboard queries", ruleGroups{Groups: []ruleGroup{queries}})
}
