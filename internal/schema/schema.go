package schema

import (
	"errors"
	"fmt"
)

// Unversioned is the version of state written before stamps existed: a
// piece of state without a stamp has this layout.
const Unversioned = 1

// Stamp is the version recorded with a piece of state.
type Stamp struct {
	// Version is the layout the state has.
	Version uint32 `json:"version"`
	// MinReader is the oldest layout version whose code reads this state
	// correctly: a change that only adds keeps it, one that changes the
	// meaning of what is there raises it to Version.
	MinReader uint32 `json:"minReader"`
}

// Format is one kind of state as this build knows it.
type Format struct {
	// What names the state in errors and logs, e.g. "endpoint store".
	What string
	// Current is the version this build writes.
	Current uint32
	// MinReader is the oldest version that reads what this build writes.
	MinReader uint32
}

// Stamp is what this build records with state it writes.
func (f Format) Stamp() Stamp { return Stamp{Version: f.Current, MinReader: f.MinReader} }

// Decision is what Check found a build must do with existing state.
type Decision int

const (
	// UseAsIs: the state has this build's version.
	UseAsIs Decision = iota
	// Migrate: the state is older; migrate it forward, then record Stamp.
	Migrate
	// ReadNewer: the state is newer but readable (additive change). Use it
	// and leave its stamp as it is.
	ReadNewer
)

// TooNewError is Check's refusal of state this build cannot read.
type TooNewError struct {
	What, Where string
	Found       Stamp
	Supported   uint32
}

func (e *TooNewError) Error() string {
	return fmt.Sprintf("%s %s has schema version %d, readable by version %d and later; this build reads versions up to %d: "+
		"refusing to use it and leaving it untouched (run a release that reads version %d, or remove the state to start afresh)",
		e.What, e.Where, e.Found.Version, e.Found.MinReader, e.Supported, e.Found.MinReader)
}

// IsTooNew reports whether err is, or wraps, a TooNewError.
func IsTooNew(err error) bool {
	var tn *TooNewError
	return errors.As(err, &tn)
}

// Check decides what to do with state at where stamped found; the zero
// Stamp means state written before stamps (Unversioned). It fails only for
// state this build cannot read, with a *TooNewError, or for a stamp that
// contradicts itself.
func (f Format) Check(where string, found Stamp) (Decision, error) {
	if found == (Stamp{}) {
		found = Stamp{Version: Unversioned, MinReader: Unversioned}
	}
	if found.MinReader == 0 || found.MinReader > found.Version {
		return 0, fmt.Errorf("%s %s: invalid schema stamp (version %d, minReader %d)", f.What, where, found.Version, found.MinReader)
	}
	switch {
	case found.Version == f.Current:
		return UseAsIs, nil
	case found.Version < f.Current:
		return Migrate, nil
	case found.MinReader <= f.Current:
		return ReadNewer, nil
	}
	return 0, &TooNewError{What: f.What, Where: where, Found: found, Supported: f.Current}
}
