package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/coordino/coordino/internal/schema"
)

// Mode says how an attachment was made; it is recorded at ADD because DEL
// cannot tell (libcni hands every plugin a prevResult on DEL).
type Mode string

const (
	// ModePrimary: Coordino created the pod interface and allocated its addresses.
	ModePrimary Mode = "primary"
	// ModeChained: another plugin made the interface; Coordino only attached to it.
	ModeChained Mode = "chained"
)

// Key identifies one attachment, as the CNI spec does.
type Key struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// String is the stable text form "network/containerID/ifname".
func (k Key) String() string { return k.Network + "/" + k.ContainerID + "/" + k.IfName }

func (k Key) bytes() []byte { return []byte(k.String()) }

// Endpoint is one pod attachment.
type Endpoint struct {
	Key
	Mode         Mode              `json:"mode"`
	Netns        string            `json:"netns"`             // CNI_NETNS at ADD
	PinPath      string            `json:"pinPath,omitempty"` // bind mount keeping the netns alive
	HostIfName   string            `json:"hostIfName,omitempty"`
	PodNamespace string            `json:"podNamespace,omitempty"`
	PodName      string            `json:"podName,omitempty"`
	PodUID       string            `json:"podUID,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	IPs          []netip.Prefix    `json:"ips,omitempty"`
	MTU          int               `json:"mtu,omitempty"`
	Identity     uint32            `json:"identity,omitempty"`
	Created      time.Time         `json:"created"`
	// Generation identifies this attachment among all attachments of the key
	// over time: assigned by the first Put from a persisted counter, it only
	// grows, whatever the clocks do.
	Generation uint64 `json:"generation,omitempty"`
	// Networks (chained mode) are the pod's addresses with the prefix
	// length prevResult gave them (10.22.0.5/16): the networks the primary
	// plugin put the pod on. Additive: records written before it have none,
	// and an older daemon reads a record that has them.
	Networks []netip.Prefix `json:"networks,omitempty"`
}

var (
	bucketEndpoints = []byte("endpoints")
	// bucketMeta holds the store's schema stamp under keySchema.
	bucketMeta = []byte("meta")
	keySchema  = []byte("schema")
)

// Format is the store's layout. Version 1 (unstamped): the endpoints
// bucket of JSON records. Version 2 adds the meta bucket and its stamp;
// version 1 code reads it (it ignores the bucket).
var Format = schema.Format{What: "endpoint store", Current: 2, MinReader: 1}

// Store persists endpoints. Safe for concurrent use.
type Store struct {
	db    *bolt.DB
	group groupCommit
}

// Open opens (creating) the store file under stateDir.
func Open(stateDir string) (*Store, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", stateDir, err)
	}
	path := filepath.Join(stateDir, "endpoints.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open endpoint store %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return migrate(tx, path) }); err != nil {
		db.Close()
		if schema.IsTooNew(err) {
			return nil, err
		}
		return nil, fmt.Errorf("initialise endpoint store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// migrate checks the store's stamp and brings an older store to Format in
// the same transaction; a store too new to read is left as it is (the
// transaction rolls back).
func migrate(tx *bolt.Tx, path string) error {
	found, stamped, err := readStamp(tx)
	if err != nil {
		return err
	}
	if !stamped && tx.Bucket(bucketEndpoints) == nil {
		found = Format.Stamp() // a new store
	}
	decision, err := Format.Check(path, found)
	if err != nil {
		return err
	}
	if _, err = tx.CreateBucketIfNotExists(bucketEndpoints); err != nil {
		return err
	}
	if decision == schema.ReadNewer || decision == schema.UseAsIs && stamped {
		return nil // a newer build's stamp stays; a current one is there
	}
	// Version 1 → 2 is the stamp itself; later steps go before it.
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	data, err := json.Marshal(Format.Stamp())
	if err != nil {
		return err
	}
	return meta.Put(keySchema, data)
}

// readStamp returns the store's stamp, and whether it has one.
func readStamp(tx *bolt.Tx) (schema.Stamp, bool, error) {
	var st schema.Stamp
	data := bucketValue(tx, bucketMeta, keySchema)
	if data == nil {
		return st, false, nil
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, false, fmt.Errorf("decode schema stamp: %w", err)
	}
	return st, true, nil
}

func bucketValue(tx *bolt.Tx, bucket, key []byte) []byte {
	if b := tx.Bucket(bucket); b != nil {
		return b.Get(key)
	}
	return nil
}

// Schema returns the stamp the store carries.
func (s *Store) Schema() (schema.Stamp, error) {
	var st schema.Stamp
	err := s.db.View(func(tx *bolt.Tx) error {
		var stamped bool
		var err error
		if st, stamped, err = readStamp(tx); err == nil && !stamped {
			err = errors.New("no schema stamp")
		}
		return err
	})
	if err != nil {
		return st, fmt.Errorf("endpoint store schema: %w", err)
	}
	return st, nil
}

// CheckSchema reads, without changing anything, the stamp of the store
// under stateDir and fails with a *schema.TooNewError when this build
// cannot read it; a missing store is fine. The daemon calls it before it
// touches any state.
func CheckSchema(stateDir string) error {
	path := filepath.Join(stateDir, "endpoints.db")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, ReadOnly: true})
	if err != nil {
		return fmt.Errorf("open endpoint store %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		found, _, err := readStamp(tx)
		if err != nil {
			return fmt.Errorf("endpoint store %s: %w", path, err)
		}
		_, err = Format.Check(path, found)
		return err
	})
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Put writes ep durably (fsync), replacing any record with the same key.
// A record without a Generation gets the next one. Concurrent Puts and
// Deletes share transactions (groupCommit).
func (s *Store) Put(ep *Endpoint) error {
	var gen uint64
	if err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEndpoints)
		rec := *ep
		if rec.Generation == 0 {
			var err error
			if rec.Generation, err = b.NextSequence(); err != nil {
				return err
			}
		}
		data, err := json.Marshal(&rec)
		if err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		gen = rec.Generation
		return b.Put(ep.Key.bytes(), data)
	}); err != nil {
		return fmt.Errorf("store endpoint %s: %w", ep.Key, err)
	}
	ep.Generation = gen
	return nil
}

// ErrNotFound is returned by Get for an unknown key.
var ErrNotFound = errors.New("endpoint not found")

// Get returns the record for k or ErrNotFound.
func (s *Store) Get(k Key) (*Endpoint, error) {
	var ep *Endpoint
	err := s.db.View(func(tx *bolt.Tx) error {
		data := tx.Bucket(bucketEndpoints).Get(k.bytes())
		if data == nil {
			return ErrNotFound
		}
		var err error
		ep, err = decode(data)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", k, err)
	}
	return ep, nil
}

// Delete removes the record for k; deleting an absent record is not an error.
func (s *Store) Delete(k Key) error {
	if err := s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEndpoints).Delete(k.bytes())
	}); err != nil {
		return fmt.Errorf("delete endpoint %s: %w", k, err)
	}
	return nil
}

// List returns every record, or only those of one network when network != "".
func (s *Store) List(network string) ([]*Endpoint, error) {
	var out []*Endpoint
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketEndpoints).ForEach(func(k, v []byte) error {
			ep, err := decode(v)
			if err != nil {
				return fmt.Errorf("record %q: %w", k, err)
			}
			if network == "" || ep.Network == network {
				out = append(out, ep)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return out, nil
}

func decode(data []byte) (*Endpoint, error) {
	var ep Endpoint
	if err := json.Unmarshal(data, &ep); err != nil {
		return nil, fmt.Errorf("decode endpoint: %w", err)
	}
	return &ep, nil
}
