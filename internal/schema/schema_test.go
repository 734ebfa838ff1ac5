package schema

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	f := Format{What: "endpoint store", Current: 3, MinReader: 2}
	for _, tc := range []struct {
		found Stamp
		want  Decision
		err   string
	}{
		{Stamp{}, Migrate, ""}, // unversioned is version 1
		{Stamp{Version: 2, MinReader: 1}, Migrate, ""},
		{Stamp{Version: 3, MinReader: 2}, UseAsIs, ""},
		{Stamp{Version: 5, MinReader: 3}, ReadNewer, ""},
		{Stamp{Version: 5, MinReader: 4}, 0, "endpoint store /s/endpoints.db has schema version 5, readable by version 4 and later; this build reads versions up to 3"},
		{Stamp{Version: 2, MinReader: 0}, 0, "invalid schema stamp"},
		{Stamp{Version: 2, MinReader: 3}, 0, "invalid schema stamp"},
	} {
		got, err := f.Check("/s/endpoints.db", tc.found)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: error %v, want one containing %q", tc.found, err, tc.err)
			}
			if strings.Contains(tc.err, "readable") && !IsTooNew(err) {
				t.Errorf("%+v: %v is not a TooNewError", tc.found, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: got %v, %v; want %v", tc.found, got, err, tc.want)
		}
	}
}
