package conflist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// PluginType is the CNI "type" of Coordino's plugin binary.
const PluginType = "coordino"

// Defaults of Coordino's own (primary-mode) conflist.
const (
	DefaultName       = "coordino"
	DefaultCNIVersion = "1.1.0"
	DefaultFilename   = "10-coordino.conflist"
)

// Format is the shape of a CNI config file.
type Format int

const (
	// FormatConf is a single plugin config (.conf, or .json without "plugins").
	FormatConf Format = iota
	// FormatList is a network config list (.conflist, or .json with "plugins").
	FormatList
)

// String returns "conf" or "conflist".
func (f Format) String() string {
	if f == FormatConf {
		return "conf"
	}
	return "conflist"
}

// ErrLastPlugin is returned by RemoveCoordino when Coordino is the only plugin,
// so removing it would leave an invalid config.
var ErrLastPlugin = errors.New("coordino is the only plugin; removing it would leave no plugin")

// Knobs are the keys of Coordino's plugin entry that the installer owns. A
// zero field means "not set": the key is left out and the plugin default applies.
type Knobs struct {
	RunDir   string // "runDir"; the plugin defaults to /run/coordino
	MTU      int    // "mtu"; 0 lets the daemon choose
	LogLevel string // "logLevel": debug, info, warn or error
}

// Validate reports the first knob with a value the plugin would refuse.
func (k Knobs) Validate() error {
	if k.RunDir != "" && (!path.IsAbs(k.RunDir) || path.Clean(k.RunDir) != k.RunDir) {
		return fmt.Errorf("runDir: %q is not a clean absolute path", k.RunDir)
	}
	// The daemon refuses a pod MTU below 576 (IPv4's minimum datagram size
	// every host must accept): a conflist it would refuse on every ADD is
	// refused here, at install time.
	if k.MTU != 0 && (k.MTU < 576 || k.MTU > 65535) {
		return fmt.Errorf("mtu: %d is outside 576..65535", k.MTU)
	}
	switch k.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("logLevel: %q is not one of debug, info, warn, error", k.LogLevel)
	}
	return nil
}

// Options describe Coordino's own conflist for primary mode. Empty Name and
// CNIVersion take DefaultName and DefaultCNIVersion.
type Options struct {
	Name       string
	CNIVersion string
	Knobs
	// PortMap chains the reference portmap plugin after Coordino, so pods'
	// hostPorts work (runtimes pass them as runtimeConfig.portMappings).
	PortMap bool
	// PortMapBackend pins portmap's "backend": "iptables" or "nftables".
	// Empty leaves the key out: portmap uses iptables where the host has
	// it, else nftables.
	PortMapBackend string
}

// PortMapType is the CNI "type" of the reference portmap plugin.
const PortMapType = "portmap"

func (o Options) validate() error {
	if err := o.Knobs.Validate(); err != nil {
		return err
	}
	switch o.PortMapBackend {
	case "", "iptables", "nftables":
	default:
		return fmt.Errorf("portmap backend: %q is not iptables or nftables", o.PortMapBackend)
	}
	if o.PortMapBackend != "" && !o.PortMap {
		return errors.New("portmap backend: set without portmap")
	}
	return nil
}

// portMapPlugin is portmap's entry: it asks the runtime for the pod's port
// mappings and keeps portmap's default "snat": true, which hostPorts reached
// from the node itself (127.0.0.1, hairpin) need.
func portMapPlugin(backend string) object {
	p := object{{key: "type", val: mustJSON(PortMapType)}, {key: "capabilities", val: mustJSON(map[string]bool{"portMappings": true})}}
	if backend != "" {
		p = p.set("backend", mustJSON(backend))
	}
	return p
}

// Build returns Coordino's primary conflist: one network of Coordino, then
// portmap if Options.PortMap, formatted with two-space indentation and a final newline.
func Build(opts Options) ([]byte, error) {
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if opts.CNIVersion == "" {
		opts.CNIVersion = DefaultCNIVersion
	}
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("build conflist: %w", err)
	}
	c := &Config{
		Format:  FormatList,
		top:     object{{key: "cniVersion", val: mustJSON(opts.CNIVersion)}, {key: "name", val: mustJSON(opts.Name)}, {key: "plugins"}},
		plugins: []object{applyKnobs(object{{key: "type", val: mustJSON(PluginType)}}, opts.Knobs)},
	}
	if opts.PortMap {
		c.plugins = append(c.plugins, portMapPlugin(opts.PortMapBackend))
	}
	if err := c.validate(); err != nil { // a bad name must fail here, not in the runtime
		return nil, fmt.Errorf("build conflist: %w", err)
	}
	return c.Bytes(), nil
}

// IsConfigFile reports whether a runtime would read name as a CNI config:
// libcni loads files ending in .conf, .conflist or .json.
func IsConfigFile(name string) bool {
	switch filepath.Ext(name) {
	case ".conf", ".conflist", ".json":
		return true
	}
	return false
}

// Config is a parsed CNI config file. Everything Coordino does not edit is
// kept as the original JSON text, in the original order.
type Config struct {
	// Format is the shape of the file as parsed, or FormatList after a
	// conf was turned into a list.
	Format Format
	// top holds the list's members (its "plugins" value is regenerated from
	// plugins on output); nil for a conf.
	top object
	// plugins holds the list's plugins in order, or the conf itself.
	plugins []object
}

// Parse reads a .conf, .conflist or .json CNI config and validates it. Errors
// name filename and the offending field.
func Parse(data []byte, filename string) (*Config, error) {
	c, err := parse(data, filename)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", filename, err)
	}
	return c, nil
}

func parse(data []byte, filename string) (*Config, error) {
	o, err := parseObject(data)
	if err != nil {
		return nil, err
	}
	var c Config
	switch ext := filepath.Ext(filename); {
	case ext == ".conflist", ext == ".json" && o.has("plugins"):
		c.Format, c.top = FormatList, o
		raw, ok := o.get("plugins")
		if !ok {
			return nil, errors.New("plugins: missing")
		}
		elems, err := parseArray(raw)
		if err != nil {
			return nil, fmt.Errorf("plugins: %w", err)
		}
		for i, e := range elems {
			p, err := parseObject(e)
			if err != nil {
				return nil, fmt.Errorf("plugins[%d]: %w", i, err)
			}
			c.plugins = append(c.plugins, p)
		}
	case ext == ".conf", ext == ".json":
		c.Format, c.plugins = FormatConf, []object{o}
	default:
		return nil, fmt.Errorf("file name: extension %q is not .conf, .conflist or .json", ext)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// validate applies the rules libcni applies when a runtime loads the file,
// plus "name is not empty".
func (c *Config) validate() error {
	if c.Format == FormatConf {
		o := c.plugins[0]
		if err := requireName(o); err != nil {
			return err
		}
		if _, _, err := o.stringField("cniVersion"); err != nil {
			return err
		}
		_, err := pluginType(o)
		return err
	}
	if err := requireName(c.top); err != nil {
		return err
	}
	if _, _, err := c.top.stringField("cniVersion"); err != nil {
		return err
	}
	if raw, ok := c.top.get("cniVersions"); ok {
		var vs []string
		if err := json.Unmarshal(raw, &vs); err != nil || vs == nil {
			return fmt.Errorf("cniVersions: must be an array of strings")
		}
	}
	for _, key := range []string{"disableCheck", "disableGC", "loadOnlyInlinedPlugins"} {
		if err := checkBool(c.top, key); err != nil {
			return err
		}
	}
	if len(c.plugins) == 0 {
		return errors.New("plugins: empty; a network needs at least one plugin")
	}
	for i, p := range c.plugins {
		if _, err := pluginType(p); err != nil {
			return fmt.Errorf("plugins[%d].%w", i, err)
		}
	}
	return nil
}

func requireName(o object) error {
	name, ok, err := o.stringField("name")
	switch {
	case err != nil:
		return err
	case !ok:
		return errors.New("name: missing")
	case strings.TrimSpace(name) == "":
		return errors.New("name: empty")
	}
	return nil
}

func pluginType(p object) (string, error) {
	t, ok, err := p.stringField("type")
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "", errors.New("type: missing")
	case t == "":
		return "", errors.New("type: empty")
	}
	return t, nil
}

// checkBool accepts what libcni accepts: a boolean or "true"/"false" in any case.
func checkBool(o object, key string) error {
	raw, ok := o.get(key)
	if !ok {
		return nil
	}
	var v any
	_ = json.Unmarshal(raw, &v) // raw was validated by the decoder
	switch b := v.(type) {
	case bool:
		return nil
	case string:
		if s := strings.ToLower(b); s == "true" || s == "false" {
			return nil
		}
	}
	return fmt.Errorf("%s: must be a boolean, got %s", key, raw)
}

// Name returns the network name.
func (c *Config) Name() string {
	o := c.top
	if c.Format == FormatConf {
		o = c.plugins[0]
	}
	s, _, _ := o.stringField("name")
	return s
}

// CNIVersion returns the top-level cniVersion, or "" when absent.
func (c *Config) CNIVersion() string {
	o := c.top
	if c.Format == FormatConf {
		o = c.plugins[0]
	}
	s, _, _ := o.stringField("cniVersion")
	return s
}

// PluginTypes returns the "type" of every plugin, in chain order.
func (c *Config) PluginTypes() []string {
	types := make([]string, len(c.plugins))
	for i, p := range c.plugins {
		types[i], _ = pluginType(p)
	}
	return types
}

// Bytes returns the config as indented JSON. Values keep their original text;
// only whitespace between tokens may differ from the parsed input.
func (c *Config) Bytes() []byte {
	var buf bytes.Buffer
	if c.Format == FormatConf {
		c.plugins[0].encode(&buf)
	} else {
		var list bytes.Buffer
		list.WriteByte('[')
		for i, p := range c.plugins {
			if i > 0 {
				list.WriteByte(',')
			}
			p.encode(&list)
		}
		list.WriteByte(']')
		c.top.clone().set("plugins", list.Bytes()).encode(&buf)
	}
	out, err := pretty(buf.Bytes())
	if err != nil { // every value came from the JSON decoder or json.Marshal
		panic(fmt.Sprintf("conflist: re-encoding produced invalid JSON: %v", err))
	}
	return out
}

// toList turns a conf into the equivalent list, as libcni does when a runtime
// loads a .conf: name and cniVersion move to the list, every other key stays
// with the plugin.
func (c *Config) toList() {
	if c.Format == FormatList {
		return
	}
	conf := c.plugins[0]
	var top, plugin object
	for _, m := range conf {
		if m.key == "name" || m.key == "cniVersion" {
			top = append(top, m)
		} else {
			plugin = append(plugin, m)
		}
	}
	c.Format, c.top, c.plugins = FormatList, append(top, member{key: "plugins"}), []object{plugin}
}

func isCoordino(p object) bool {
	t, _ := pluginType(p)
	return t == PluginType
}

// applyKnobs returns p with the installer-owned keys set from k; unset knobs
// are removed so that the file always says exactly what the installer was told.
func applyKnobs(p object, k Knobs) object {
	p = p.clone()
	p = setOrDel(p, "runDir", k.RunDir != "", k.RunDir)
	p = setOrDel(p, "mtu", k.MTU != 0, k.MTU)
	p = setOrDel(p, "logLevel", k.LogLevel != "", k.LogLevel)
	return p
}

func setOrDel(p object, key string, set bool, v any) object {
	if !set {
		return p.del(key)
	}
	return p.set(key, mustJSON(v))
}

// InsertCoordino adds Coordino at the end of the plugin chain of the config
// in data (read from filename, whose extension decides its format). A conf
// becomes a conflist: the caller must store the result under a .conflist
// name. If Coordino is already in the chain, its knobs are updated where it
// stands; when nothing changes the original bytes are returned and changed is
// false, so re-running never rewrites a file.
func InsertCoordino(data []byte, filename string, k Knobs) (out []byte, changed bool, err error) {
	if err := k.Validate(); err != nil {
		return nil, false, fmt.Errorf("insert coordino into %s: %w", filename, err)
	}
	c, err := Parse(data, filename)
	if err != nil {
		return nil, false, err
	}
	found := false
	for i, p := range c.plugins {
		if !isCoordino(p) {
			continue
		}
		found = true
		np := applyKnobs(p, k)
		if !bytes.Equal(np.compact(), p.compact()) {
			c.plugins[i], changed = np, true
		}
	}
	if found {
		if !changed {
			return data, false, nil
		}
		return c.Bytes(), true, nil
	}
	c.toList()
	c.plugins = append(c.plugins, applyKnobs(object{{key: "type", val: mustJSON(PluginType)}}, k))
	return c.Bytes(), true, nil
}

// RemoveCoordino removes every Coordino plugin from the chain in data, keeping
// the format it was read in. Without Coordino it returns data unchanged and
// changed=false. If Coordino is the only plugin it returns ErrLastPlugin.
// A list that InsertCoordino made from a conf stays a one-plugin list; pass it
// to ListToConf to get the conf back.
func RemoveCoordino(data []byte, filename string) (out []byte, changed bool, err error) {
	c, err := Parse(data, filename)
	if err != nil {
		return nil, false, err
	}
	keep := c.plugins[:0:0]
	for _, p := range c.plugins {
		if !isCoordino(p) {
			keep = append(keep, p)
		}
	}
	if len(keep) == len(c.plugins) {
		return data, false, nil
	}
	if len(keep) == 0 {
		return nil, false, fmt.Errorf("remove coordino from %s: %w", filename, ErrLastPlugin)
	}
	c.plugins = keep
	return c.Bytes(), true, nil
}

// ConfToList returns the conflist equivalent of a conf (see InsertCoordino);
// a list is returned unchanged.
func ConfToList(data []byte, filename string) ([]byte, error) {
	c, err := Parse(data, filename)
	if err != nil {
		return nil, err
	}
	if c.Format == FormatList {
		return data, nil
	}
	c.toList()
	return c.Bytes(), nil
}

// ListToConf turns a one-plugin list back into a single-plugin conf: the
// list's top-level keys (name, cniVersion, any others) come first, in their
// order, followed by the plugin's keys. For a list made by ConfToList or
// InsertCoordino+RemoveCoordino from a conf, the result is equivalent to that
// conf: the same keys with the same values, where only the position of name
// and cniVersion and whitespace may differ. A key present in both the list and
// the plugin with different values is an error.
func ListToConf(data []byte, filename string) ([]byte, error) {
	c, err := Parse(data, filename)
	if err != nil {
		return nil, err
	}
	if c.Format == FormatConf {
		return data, nil
	}
	if len(c.plugins) != 1 {
		return nil, fmt.Errorf("convert %s to a conf: plugins: has %d plugins, a conf holds exactly one", filename, len(c.plugins))
	}
	conf := c.top.del("plugins")
	for _, m := range c.plugins[0] {
		if v, ok := conf.get(m.key); ok {
			if !bytes.Equal(compactRaw(v), compactRaw(m.val)) {
				return nil, fmt.Errorf("convert %s to a conf: plugins[0].%s: differs from the list's %s", filename, m.key, m.key)
			}
			continue
		}
		conf = append(conf, m)
	}
	out := &Config{Format: FormatConf, plugins: []object{conf}}
	if err := out.validate(); err != nil {
		return nil, fmt.Errorf("convert %s to a conf: %w", filename, err)
	}
	return out.Bytes(), nil
}

func compactRaw(raw json.RawMessage) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw
	}
	return buf.Bytes()
}
