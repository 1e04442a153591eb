package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"
)

// The plots are SVG written as text: the standard library can write it, it
// needs no font and no rasterizer (lines, dashes and text are the viewer's
// to draw), and browsers and GitHub render it. The repository takes no
// plotting dependency for a few pictures.

type series struct {
	name   string
	color  color.RGBA
	dashed bool
	xs, ys []float64
}

// point is a marked target, drawn as a hollow diamond.
type point struct{ x, y float64 }

type chart struct {
	title, xLabel, yLabel string
	series                []series
	targets               []point
	yFormat               func(float64) string
}

var (
	black     = color.RGBA{30, 30, 30, 255}
	gray      = color.RGBA{120, 120, 120, 255}
	gridColor = color.RGBA{225, 225, 225, 255}
	red       = color.RGBA{220, 30, 30, 255}
)

// methodStyle gives each method one look in every plot.
var methodStyle = map[string]struct {
	c      color.RGBA
	dashed bool
}{
	methodNftproxy:        {color.RGBA{20, 80, 200, 255}, false},
	methodCompile:         {color.RGBA{90, 160, 240, 255}, true},
	methodApply:           {color.RGBA{0, 170, 190, 255}, true},
	methodFullDiff:        {color.RGBA{30, 150, 60, 255}, true},
	methodNftText:         {color.RGBA{240, 140, 0, 255}, false},
	methodLegacy:          {color.RGBA{200, 30, 40, 255}, false},
	methodLegacyPartial:   {color.RGBA{200, 30, 40, 255}, true},
	methodIptNft:          {color.RGBA{130, 50, 170, 255}, false},
	methodIptNftPartial:   {color.RGBA{130, 50, 170, 255}, true},
	methodConnNftFirst:    {color.RGBA{90, 160, 240, 255}, true},
	methodConnNftLast:     {color.RGBA{20, 80, 200, 255}, false},
	methodConnLegacyFirst: {color.RGBA{240, 120, 120, 255}, true},
	methodConnLegacyLast:  {color.RGBA{200, 30, 40, 255}, false},
}

// Layout of one panel and the legend, in pixels; charWidth is a guess at the
// mean width of a character at fontSize, to lay out the legend's columns.
const (
	panelW    = 620
	panelH    = 470
	fontSize  = 16
	charWidth = 9
	legendRow = 24
)

// panel is one picture of a plot file, a line chart or a bar chart: draw
// draws it from x0 on and returns its width, its legend and whether it marks
// targets.
type panel interface {
	draw(cv *canvas, x0 int) (w int, legend []series, targets bool)
}

// canvas collects the elements of one SVG picture.
type canvas struct{ bytes.Buffer }

func (cv *canvas) el(format string, args ...any) { fmt.Fprintf(cv, format+"\n", args...) }

// text writes s at (x, y), its baseline; attrs adds attributes such as an anchor.
func (cv *canvas) text(x, y int, attrs, s string) {
	fmt.Fprintf(cv, `<text x="%d" y="%d" %s>`, x, y, attrs)
	_ = xml.EscapeText(cv, []byte(s)) // a bytes.Buffer does not fail
	cv.WriteString("</text>\n")
}

// polyline strokes the points in order; dashed lines alternate 12 on and 8 off.
func (cv *canvas) polyline(pts []image.Point, c color.RGBA, width int, dashed bool) {
	var s []string
	for _, p := range pts {
		s = append(s, fmt.Sprintf("%d,%d", p.X, p.Y))
	}
	dash := ""
	if dashed {
		dash = ` stroke-dasharray="12 8"`
	}
	cv.el(`<polyline points="%s" fill="none" stroke="%s" stroke-width="%d"%s/>`, strings.Join(s, " "), hex(c), width, dash)
}

// rect fills r, or outlines it two pixels wide.
func (cv *canvas) rect(r image.Rectangle, c color.RGBA, hollow bool) {
	paint := fmt.Sprintf(`fill="%s"`, hex(c))
	if hollow {
		paint = fmt.Sprintf(`fill="none" stroke="%s" stroke-width="2"`, hex(c))
	}
	cv.el(`<rect x="%d" y="%d" width="%d" height="%d" %s/>`, r.Min.X, r.Min.Y, r.Dx(), r.Dy(), paint)
}

// diamond outlines a target's diamond of radius r around (x, y).
func (cv *canvas) diamond(x, y, r int) {
	cv.polyline([]image.Point{{x - r, y}, {x, y - r}, {x + r, y}, {x, y + r}, {x - r, y}}, red, 2, false)
}

func hex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// writeSVG draws the panels side by side with one legend below them.
func writeSVG(path string, panels ...panel) error {
	var body canvas
	var legend []series
	hasTarget := false
	w := 0
	for _, p := range panels {
		pw, entries, targets := p.draw(&body, w)
		for _, s := range entries {
			if !slices.ContainsFunc(legend, func(l series) bool { return l.name == s.name }) {
				legend = append(legend, s)
			}
		}
		hasTarget = hasTarget || targets
		w += pw
	}
	if hasTarget {
		legend = append(legend, series{name: "target"}) // drawn as a diamond
	}
	// Columns as wide as the longest legend entry (line, gap, text).
	longest := 0
	for _, s := range legend {
		longest = max(longest, len([]rune(s.name))*charWidth)
	}
	perRow := max(1, w/max(340, longest+60))
	h := panelH + (len(legend)+perRow-1)/perRow*legendRow + 20
	var cv canvas
	cv.el(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" `+
		`font-size="%d" fill="%s">`, w, h, w, h, fontSize, hex(black))
	cv.el(`<rect width="%d" height="%d" fill="white"/>`, w, h)
	cv.Write(body.Bytes())
	for i, s := range legend {
		x, mid := 20+(i%perRow)*(w/perRow), panelH+(i/perRow)*legendRow+8
		if hasTarget && i == len(legend)-1 {
			cv.diamond(x+15, mid, 6)
		} else {
			cv.polyline([]image.Point{{x, mid}, {x + 30, mid}}, s.color, 3, s.dashed)
		}
		cv.text(x+40, mid+6, "", s.name)
	}
	cv.el("</svg>")
	if err := os.WriteFile(path, cv.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}

// axes draws a panel's title, the log y axis of the values ys (whole decades,
// the grid at 1, 2 and 5 of each, labelled at decades), its frame and label,
// and returns the plot area and the pixel row of a value; with no values it
// writes "no data" and returns a nil row function.
func axes(cv *canvas, x0, w int, title, label string, ys []float64,
	format func(float64) string) (image.Rectangle, func(float64) int) {
	cv.text(x0+w/2, 30, `text-anchor="middle" font-weight="bold"`, title)
	// Room on the left for decade labels and the y label, below for x labels.
	plot := image.Rect(x0+124, 50, x0+w-20, panelH-70)
	if len(ys) == 0 {
		cv.text(plot.Min.X+20, plot.Min.Y+30, fmt.Sprintf(`fill="%s"`, hex(gray)), "no data")
		return plot, nil
	}
	ylo, yhi := math.Floor(math.Log10(slices.Min(ys))), math.Ceil(math.Log10(slices.Max(ys)))
	if yhi == ylo {
		yhi++
	}
	py := func(y float64) int {
		return plot.Max.Y - int((math.Log10(y)-ylo)/(yhi-ylo)*float64(plot.Dy()))
	}
	for d := ylo; d <= yhi; d++ {
		for _, k := range []float64{1, 2, 5} {
			if d == yhi && k > 1 {
				break // the top decade ends the axis
			}
			y := py(k * math.Pow(10, d))
			cv.polyline([]image.Point{{plot.Min.X, y}, {plot.Max.X, y}}, gridColor, 1, false)
			if k == 1 {
				cv.text(plot.Min.X-10, y+6, `text-anchor="end"`, format(math.Pow(10, d)))
			}
		}
	}
	cv.rect(plot, gray, true)
	x, y := plot.Min.X-90, plot.Min.Y+plot.Dy()/2
	cv.text(x, y, fmt.Sprintf(`text-anchor="middle" transform="rotate(-90 %d %d)"`, x, y), label)
	return plot, py
}

func (c chart) draw(cv *canvas, x0 int) (int, []series, bool) {
	var xs, ys []float64
	for _, s := range c.series {
		xs, ys = append(xs, s.xs...), append(ys, s.ys...)
	}
	if len(xs) > 0 { // targets alone are no data
		for _, p := range c.targets {
			ys = append(ys, p.y)
		}
	}
	plot, py := axes(cv, x0, panelW, c.title, c.yLabel, ys, c.yFormat)
	if py == nil {
		return panelW, c.series, len(c.targets) > 0
	}
	// A little room on x so end markers show.
	xlo, xhi := math.Log10(slices.Min(xs))-0.05, math.Log10(slices.Max(xs))+0.05
	px := func(x float64) int {
		return plot.Min.X + int((math.Log10(x)-xlo)/(xhi-xlo)*float64(plot.Dx()))
	}
	// The x grid at the measured sizes.
	for _, x := range slices.Compact(slices.Sorted(slices.Values(xs))) {
		cv.polyline([]image.Point{{px(x), plot.Min.Y}, {px(x), plot.Max.Y}}, gridColor, 1, false)
		cv.text(px(x), plot.Max.Y+24, `text-anchor="middle"`, sizeLabel(int(x)))
	}
	cv.text(plot.Min.X+plot.Dx()/2, plot.Max.Y+52, `text-anchor="middle"`, c.xLabel)
	for _, s := range c.series {
		var pts []image.Point
		for i := range s.xs {
			pts = append(pts, image.Pt(px(s.xs[i]), py(s.ys[i])))
		}
		cv.polyline(pts, s.color, 3, s.dashed)
		for _, p := range pts {
			cv.rect(image.Rect(p.X-4, p.Y-4, p.X+5, p.Y+5), s.color, false)
		}
	}
	for _, p := range c.targets {
		cv.diamond(px(p.x), py(p.y), 8)
	}
	return panelW, c.series, len(c.targets) > 0
}

// sizeLabel prints a service count as 1k, 50k.
func sizeLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// msLabel prints a duration in milliseconds as a round unit.
func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%g s", v/1000)
	case v >= 1:
		return fmt.Sprintf("%g ms", v)
	default:
		return fmt.Sprintf("%g µs", v*1000)
	}
}
