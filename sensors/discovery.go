package sensors

import (
	"context"
	"encoding/json"
	"maps"
	"path"
	"slices"
	"strings"
)

// Home Assistant MQTT discovery: one retained config message per quantity
// (a sensor, or a binary_sensor for a 0/1 state) and per output (a switch),
// under {discovery_prefix}/{component}/fieldgate_{device}/{object}/config.
// Every config names the gateway's availability topic and the sensor's
// status topic, so Home Assistant greys out a failing sensor. Configs of
// sensors no longer in the configuration are removed (an empty retained
// message) when discovery runs.

// haDevice is the device block shared by every entity of this gateway.
type haDevice struct {
	Identifiers  []string `json:"identifiers"`
	Name         string   `json:"name"`
	Manufacturer string   `json:"manufacturer"`
	Model        string   `json:"model"`
	SWVersion    string   `json:"sw_version,omitempty"`
}

type haAvailability struct {
	Topic         string `json:"topic"`
	ValueTemplate string `json:"value_template,omitempty"`
}

// haConfig is one entity's discovery config; empty fields are left out.
type haConfig struct {
	Name              string           `json:"name"`
	UniqueID          string           `json:"unique_id"`
	ObjectID          string           `json:"object_id"`
	StateTopic        string           `json:"state_topic"`
	CommandTopic      string           `json:"command_topic,omitempty"`
	ValueTemplate     string           `json:"value_template,omitempty"`
	Unit              string           `json:"unit_of_measurement,omitempty"`
	DeviceClass       string           `json:"device_class,omitempty"`
	StateClass        string           `json:"state_class,omitempty"`
	PayloadOn         string           `json:"payload_on,omitempty"`
	PayloadOff        string           `json:"payload_off,omitempty"`
	Availability      []haAvailability `json:"availability"`
	AvailabilityMode  string           `json:"availability_mode,omitempty"`
	SuggestedDecimals *int             `json:"suggested_display_precision,omitempty"`
	Device            haDevice         `json:"device"`
}

// discoveryNode is the node_id level of this gateway's discovery topics.
func (p *Poller) discoveryNode() string { return "fieldgate_" + p.gw.Name }

func (p *Poller) haDevice() haDevice {
	return haDevice{Identifiers: []string{p.discoveryNode()}, Name: "fieldgate " + p.gw.Name, Manufacturer: "fieldgate", Model: "fieldgate gateway", SWVersion: p.opts.Version}
}

// sensorConfigs adds to out the discovery configs of one sensor's
// quantities; qs are the quantities it reports.
func (p *Poller) sensorConfigs(out map[string][]byte, s *sensor, qs []Quantity) {
	node := p.discoveryNode()
	gwAvail := haAvailability{Topic: p.topics.availability()}
	status := haAvailability{Topic: p.topics.of(s.cfg.Name, "status"), ValueTemplate: "{{ 'online' if value_json.state == 'ok' else 'offline' }}"}
	for _, q := range qs {
		object := s.cfg.Name + "_" + q.Name
		c := haConfig{
			Name: s.cfg.Name + " " + q.Name, UniqueID: node + "_" + object, ObjectID: p.gw.Name + "_" + object,
			StateTopic: p.topics.of(s.cfg.Name, q.Name), Unit: q.Unit, DeviceClass: q.Class,
			Availability: []haAvailability{gwAvail, status}, AvailabilityMode: "all", Device: p.haDevice(),
		}
		component := "sensor"
		switch {
		case q.Binary:
			component = "binary_sensor"
			c.ValueTemplate = "{{ 'ON' if value_json.value == 1 else 'OFF' }}"
			c.Unit = ""
		case q.Total:
			c.ValueTemplate = "{{ value_json.value }}"
			c.StateClass = "total_increasing"
		default:
			c.ValueTemplate = "{{ value_json.value }}"
			c.StateClass = "measurement"
			d := q.Decimals
			c.SuggestedDecimals = &d
		}
		out[p.gw.DiscoveryPrefix+"/"+component+"/"+node+"/"+object+"/config"] = mustJSON(c)
	}
}

// outputConfig adds to out the discovery config of one output, a switch.
func (p *Poller) outputConfig(out map[string][]byte, o *output) {
	node := p.discoveryNode()
	c := haConfig{
		Name: o.cfg.Name, UniqueID: node + "_" + o.cfg.Name, ObjectID: p.gw.Name + "_" + o.cfg.Name,
		StateTopic: p.topics.of(o.cfg.Name, "state"), CommandTopic: p.topics.of(o.cfg.Name, "set"),
		PayloadOn: "ON", PayloadOff: "OFF", Availability: []haAvailability{{Topic: p.topics.availability()}}, Device: p.haDevice(),
	}
	out[p.gw.DiscoveryPrefix+"/switch/"+node+"/"+o.cfg.Name+"/config"] = mustJSON(c)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sensors: discovery config does not marshal: " + err.Error())
	}
	return b
}

// discover publishes every discovery config, retained, and clears the
// configs this gateway published earlier for entities it no longer has. A
// sensor whose quantities are known only once it is opened is announced
// then (see announce), and its earlier configs are left alone meanwhile.
func (p *Poller) discover(ctx context.Context) {
	configs := map[string][]byte{}
	var pending []string // sensors whose quantities are not known yet
	for _, s := range p.sensors {
		if qs := s.quantities(); qs != nil {
			p.sensorConfigs(configs, s, qs)
		} else {
			pending = append(pending, s.cfg.Name)
		}
	}
	for _, o := range p.outputs {
		p.outputConfig(configs, o)
	}
	for _, topic := range slices.Sorted(maps.Keys(configs)) {
		p.publishRetained(ctx, topic, configs[topic])
	}
	prefix := p.gw.DiscoveryPrefix + "/"
	for _, topic := range p.opts.Client.RetainedTopics(prefix + "+/" + p.discoveryNode() + "/+/config") {
		if _, current := configs[topic]; current || p.claimedByPending(topic, pending) {
			continue
		}
		p.log.Info("removing the discovery config of an entity no longer configured", "topic", topic)
		p.publishRetained(ctx, topic, nil)
	}
}

// claimedByPending reports whether a discovery topic's object, named
// {sensor}_{quantity}, may belong to one of the sensors not yet opened; the
// longest matching configured name wins, so sensor a does not claim a_b_x
// when a sensor a_b exists.
func (p *Poller) claimedByPending(topic string, pending []string) bool {
	if len(pending) == 0 {
		return false
	}
	object := path.Base(path.Dir(topic))
	best := ""
	for _, s := range p.sensors {
		if n := s.cfg.Name; strings.HasPrefix(object, n+"_") && len(n) > len(best) {
			best = n
		}
	}
	return best != "" && slices.Contains(pending, best)
}

// announce publishes one sensor's discovery configs once its quantities are
// known from the opened device, when they differ from what was announced.
func (p *Poller) announce(ctx context.Context, s *sensor, qs []Quantity) {
	configs := map[string][]byte{}
	p.sensorConfigs(configs, s, qs)
	for _, topic := range slices.Sorted(maps.Keys(configs)) {
		p.publishRetained(ctx, topic, configs[topic])
	}
}
