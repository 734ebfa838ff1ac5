package kubernetes

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coordino/coordino/install/image"
)

// TestImageReferences: every pod the kits deploy runs the image `make image`
// builds, under the name it is tagged with, and starts a binary (and copies a
// plugin) that the image holds at that path.
func TestImageReferences(t *testing.T) {
	inImage := map[string]bool{}
	for _, b := range image.Contents {
		inImage[b.Path] = true
	}
	for _, dir := range []string{"base", "overlays/primary", "overlays/chained", "uninstall"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			var pods []corev1.PodSpec
			for _, ds := range only[*appsv1.DaemonSet](objs) {
				pods = append(pods, ds.Spec.Template.Spec)
			}
			for _, d := range only[*appsv1.Deployment](objs) {
				pods = append(pods, d.Spec.Template.Spec)
			}
			if len(pods) == 0 {
				t.Fatal("no DaemonSet or Deployment")
			}
			for _, spec := range pods {
				for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
					if c.Image != image.DefaultRef {
						t.Errorf("%s: image %q, want %q (what make image tags)", c.Name, c.Image, image.DefaultRef)
					}
					if len(c.Command) == 0 || !inImage[c.Command[0]] {
						t.Errorf("%s: command %q is not a binary of the image", c.Name, c.Command)
					}
					for _, a := range c.Args {
						if src, ok := strings.CutPrefix(a, "--plugin-source="); ok && !inImage[src] {
							t.Errorf("%s: %s is not in the image", c.Name, a)
						}
					}
				}
			}
		})
	}
}
