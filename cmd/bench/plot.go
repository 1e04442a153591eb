package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
)

// A line chart with logarithmic axes, drawn pixel by pixel with image/png:
// the standard library has no plotting and the repository takes no plotting
// dependency for two pictures.

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
	white     = color.RGBA{255, 255, 255, 255}
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

// Layout of one panel, in pixels at the plots' text scale 2.
const (
	textScale   = 2
	panelW      = 620
	panelH      = 470
	marginLeft  = 124
	marginRight = 20
	marginTop   = 50
	marginBot   = 70
)

// panel is one picture of a plot file: a line chart or a bar chart.
type panel interface {
	draw(img *image.RGBA, r image.Rectangle)
	legend() []series
	hasTargets() bool
	width() int
}

func (c chart) legend() []series { return c.series }
func (c chart) hasTargets() bool { return len(c.targets) > 0 }
func (c chart) width() int       { return panelW }

// writePNG draws the panels side by side with one legend below them.
func writePNG(path string, panels ...panel) error {
	var legend []series
	seen := map[string]bool{}
	hasTarget := false
	w := 0
	for _, c := range panels {
		for _, s := range c.legend() {
			if !seen[s.name] {
				seen[s.name] = true
				legend = append(legend, s)
			}
		}
		hasTarget = hasTarget || c.hasTargets()
		w += c.width()
	}
	entries := len(legend)
	if hasTarget {
		entries++
	}
	// Columns as wide as the longest legend entry (line, gap, text).
	longest := 0
	for _, s := range legend {
		longest = max(longest, textWidth(s.name, textScale))
	}
	perRow := max(1, w/max(340, longest+60))
	rows := (entries + perRow - 1) / perRow
	h := panelH + rows*lineHeight*textScale + 20
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{white}, image.Point{}, draw.Src)
	x := 0
	for _, c := range panels {
		c.draw(img, image.Rect(x, 0, x+c.width(), panelH))
		x += c.width()
	}
	colW := w / perRow
	for i := range entries {
		x := 20 + (i%perRow)*colW
		y := panelH + (i/perRow)*lineHeight*textScale
		mid := y + 4*textScale
		if i == len(legend) {
			diamond(img, x+15, mid, 6, red)
			drawText(img, x+40, y, "target", textScale, black, false)
			continue
		}
		s := legend[i]
		thickLine(img, x, mid, x+30, mid, s.color, s.dashed)
		drawText(img, x+40, y, s.name, textScale, black, false)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create plot: %w", err)
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("encode plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

func (c chart) draw(img *image.RGBA, r image.Rectangle) {
	plot := image.Rect(r.Min.X+marginLeft, r.Min.Y+marginTop, r.Max.X-marginRight, r.Max.Y-marginBot)
	drawText(img, r.Min.X+(r.Dx()-textWidth(c.title, textScale))/2, r.Min.Y+12, c.title, textScale, black, false)

	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for i := range s.xs {
			xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
			ymin, ymax = math.Min(ymin, s.ys[i]), math.Max(ymax, s.ys[i])
		}
	}
	for _, p := range c.targets {
		ymin, ymax = math.Min(ymin, p.y), math.Max(ymax, p.y)
	}
	if math.IsInf(xmin, 0) {
		drawText(img, plot.Min.X+20, plot.Min.Y+20, "no data", textScale, gray, false)
		return
	}
	// A little room on x so end markers show.
	xlo, xhi := math.Log10(xmin)-0.05, math.Log10(xmax)+0.05
	px := func(x float64) int {
		return plot.Min.X + int((math.Log10(x)-xlo)/(xhi-xlo)*float64(plot.Dx()))
	}
	py := logYAxis(img, plot, ymin, ymax, c.yFormat)
	// Grid on x at the measured sizes.
	var xs []float64
	for _, s := range c.series {
		for _, x := range s.xs {
			xs = appendUnique(xs, x)
		}
	}
	for _, x := range xs {
		line(img, px(x), plot.Min.Y, px(x), plot.Max.Y, gridColor, false)
		label := sizeLabel(int(x))
		drawText(img, px(x)-textWidth(label, textScale)/2, plot.Max.Y+10, label, textScale, black, false)
	}
	rect(img, plot, gray)
	drawText(img, plot.Min.X+(plot.Dx()-textWidth(c.xLabel, textScale))/2, plot.Max.Y+38, c.xLabel, textScale, black, false)
	drawText(img, r.Min.X+12, plot.Min.Y+(plot.Dy()+textWidth(c.yLabel, textScale))/2, c.yLabel, textScale, black, true)

	for _, s := range c.series {
		for i := range s.xs {
			x, y := px(s.xs[i]), py(s.ys[i])
			if i > 0 {
				thickLine(img, px(s.xs[i-1]), py(s.ys[i-1]), x, y, s.color, s.dashed)
			}
			square(img, x, y, 4, s.color)
		}
	}
	for _, p := range c.targets {
		diamond(img, px(p.x), py(p.y), 8, red)
	}
}

func appendUnique(xs []float64, x float64) []float64 {
	for _, v := range xs {
		if v == x {
			return xs
		}
	}
	return append(xs, x)
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
		return fmt.Sprintf("%g us", v*1000)
	}
}

// line draws a one-pixel line; dashed lines alternate 6 on, 4 off.
// logYAxis spans whole decades from ymin to ymax on a log scale, draws the
// y grid in plot (1, 2 and 5 of every decade, labelled at decades) and
// returns the pixel row of a value.
func logYAxis(img *image.RGBA, plot image.Rectangle, ymin, ymax float64, format func(float64) string) func(float64) int {
	ylo, yhi := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
	if yhi == ylo {
		yhi++
	}
	py := func(y float64) int {
		return plot.Max.Y - int((math.Log10(y)-ylo)/(yhi-ylo)*float64(plot.Dy()))
	}
	for d := ylo; d <= yhi; d++ {
		for _, k := range []float64{1, 2, 5} {
			v := k * math.Pow(10, d)
			if math.Log10(v) > yhi+1e-9 {
				break
			}
			y := py(v)
			line(img, plot.Min.X, y, plot.Max.X, y, gridColor, false)
			if k == 1 {
				label := format(v)
				drawText(img, plot.Min.X-10-textWidth(label, textScale), y-7, label, textScale, black, false)
			}
		}
	}
	return py
}

func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, dashed bool) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for step := 0; ; step++ {
		if !dashed || step%10 < 6 {
			img.SetRGBA(x0, y0, c)
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

// thickLine draws a three-pixel-wide line.
func thickLine(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, dashed bool) {
	for d := -1; d <= 1; d++ {
		if abs(x1-x0) > abs(y1-y0) {
			line(img, x0, y0+d, x1, y1+d, c, dashed)
		} else {
			line(img, x0+d, y0, x1+d, y1, c, dashed)
		}
	}
}

func rect(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	line(img, r.Min.X, r.Min.Y, r.Max.X, r.Min.Y, c, false)
	line(img, r.Min.X, r.Max.Y, r.Max.X, r.Max.Y, c, false)
	line(img, r.Min.X, r.Min.Y, r.Min.X, r.Max.Y, c, false)
	line(img, r.Max.X, r.Min.Y, r.Max.X, r.Max.Y, c, false)
}

func square(img *image.RGBA, x, y, half int, c color.RGBA) {
	draw.Draw(img, image.Rect(x-half, y-half, x+half+1, y+half+1), &image.Uniform{c}, image.Point{}, draw.Src)
}

// diamond draws a hollow diamond, two pixels thick.
func diamond(img *image.RGBA, x, y, r int, c color.RGBA) {
	for _, k := range []int{r, r - 1} {
		line(img, x-k, y, x, y-k, c, false)
		line(img, x, y-k, x+k, y, c, false)
		line(img, x+k, y, x, y+k, c, false)
		line(img, x, y+k, x-k, y, c, false)
	}
}
