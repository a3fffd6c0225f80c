package opsdash

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Grafana JSON model (schemaVersion 39), only the fields dfkv's dashboards use.
type gDashboard struct {
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	Description   string      `json:"description"`
	Tags          []string    `json:"tags"`
	Timezone      string      `json:"timezone"`
	SchemaVersion int         `json:"schemaVersion"`
	Version       int         `json:"version"`
	Editable      bool        `json:"editable"`
	Refresh       string      `json:"refresh"`
	Time          gTime       `json:"time"`
	Templating    gTemplating `json:"templating"`
	Panels        []gPanel    `json:"panels"`
}

type gTime struct {
	From string `json:"from"`
	To   string `json:"to"`
}

type gTemplating struct {
	List []gVar `json:"list"`
}

type gVar struct {
	Name       string       `json:"name"`
	Label      string       `json:"label"`
	Type       string       `json:"type"`
	Query      any          `json:"query"`
	Datasource *gDatasource `json:"datasource,omitempty"`
	Refresh    int          `json:"refresh,omitempty"`
	Multi      bool         `json:"multi"`
	IncludeAll bool         `json:"includeAll"`
	AllValue   string       `json:"allValue,omitempty"`
	Current    any          `json:"current"`
	Sort       int          `json:"sort,omitempty"`
}

type gDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gPanel struct {
	ID          int          `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Description string       `json:"description,omitempty"`
	GridPos     gGrid        `json:"gridPos"`
	Datasource  *gDatasource `json:"datasource,omitempty"`
	Targets     []gTarget    `json:"targets,omitempty"`
	FieldConfig *gFieldCfg   `json:"fieldConfig,omitempty"`
	Options     any          `json:"options,omitempty"`
	Collapsed   *bool        `json:"collapsed,omitempty"`
	Panels      []gPanel     `json:"panels,omitempty"`
}

type gGrid struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type gTarget struct {
	RefID        string       `json:"refId"`
	Expr         string       `json:"expr"`
	LegendFormat string       `json:"legendFormat"`
	Datasource   *gDatasource `json:"datasource"`
}

type gFieldCfg struct {
	Defaults  gDefaults `json:"defaults"`
	Overrides []any     `json:"overrides"`
}

type gDefaults struct {
	Unit     string  `json:"unit"`
	Min      *int    `json:"min,omitempty"`
	NoValue  string  `json:"noValue,omitempty"`
	Decimals *int    `json:"decimals,omitempty"`
	Custom   any     `json:"custom,omitempty"`
	Max      *int    `json:"max,omitempty"`
	Color    *gColor `json:"color,omitempty"`
}

type gColor struct {
	Mode string `json:"mode"`
}

var ds = &gDatasource{Type: "prometheus", UID: "${datasource}"}

// JSON renders d as Grafana dashboard JSON (indented, stable field order, trailing newline).
func (d Dashboard) JSON() ([]byte, error) {
	g := gDashboard{
		UID: d.UID, Title: d.Title, Description: d.Description, Tags: []string{"dfkv"}, Timezone: "browser",
		SchemaVersion: 39, Version: 1, Editable: true, Refresh: "30s", Time: gTime{From: "now-1h", To: "now"},
	}
	g.Templating.List = append(g.Templating.List, gVar{
		Name: "datasource", Label: "Prometheus", Type: "datasource", Query: "prometheus",
		Current: map[string]any{},
	})
	if d.InstanceVar {
		v := gVar{
			Name: "instance", Label: "node", Type: "query", Datasource: ds, Refresh: 2, Sort: 1,
			Query: map[string]any{"query": "label_values(dfkv_server_build_info, instance)", "refId": "instance"},
			Multi: d.InstanceMulti, IncludeAll: d.InstanceMulti, Current: map[string]any{},
		}
		if d.InstanceMulti {
			v.AllValue = ".*"
			v.Current = map[string]any{"text": "All", "value": "$__all"}
		}
		g.Templating.List = append(g.Templating.List, v)
	}
	id, y := 1, 0
	zero := 0
	for _, r := range d.Rows {
		open := false
		g.Panels = append(g.Panels, gPanel{ID: id, Type: "row", Title: r.Title, GridPos: gGrid{H: 1, W: 24, Y: y}, Collapsed: &open})
		id++
		y++
		x, rowH := 0, 0
		for _, p := range r.Panels {
			w, h := 8, 8
			if p.Kind == "stat" {
				w, h = 4, 4
			}
			if x+w > 24 {
				x, y = 0, y+rowH
			}
			gp := gPanel{ID: id, Type: "timeseries", Title: p.Title, Description: p.Description, GridPos: gGrid{H: h, W: w, X: x, Y: y}, Datasource: ds}
			fc := &gFieldCfg{Defaults: gDefaults{Unit: p.Unit}, Overrides: []any{}}
			if p.Kind == "stat" {
				gp.Type = "stat"
				gp.Options = map[string]any{"reduceOptions": map[string]any{"calcs": []string{"lastNotNull"}, "fields": "", "values": false},
					"colorMode": "value", "graphMode": "none", "textMode": "value_and_name"}
			} else {
				fc.Defaults.Min = &zero
				gp.Options = map[string]any{"legend": map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true},
					"tooltip": map[string]any{"mode": "multi", "sort": "desc"}}
			}
			if p.Unit == "percentunit" {
				one := 1
				fc.Defaults.Max = &one
			}
			if p.RDMAOnly {
				fc.Defaults.NoValue = "no RDMA rails"
			}
			gp.FieldConfig = fc
			for i, t := range p.Targets {
				gp.Targets = append(gp.Targets, gTarget{RefID: string(rune('A' + i)), Expr: t.Expr, LegendFormat: t.Legend, Datasource: ds})
			}
			g.Panels = append(g.Panels, gp)
			id++
			x += w
			rowH = max(rowH, h)
		}
		y += rowH
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(g); err != nil {
		return nil, fmt.Errorf("opsdash: %s: %w", d.UID, err)
	}
	return buf.Bytes(), nil
}

// Panels returns every panel of d with its row, in order.
func (d Dashboard) Panels() []Panel {
	var out []Panel
	for _, r := range d.Rows {
		out = append(out, r.Panels...)
	}
	return out
}
