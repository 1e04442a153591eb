package main

import (
	"image"
	"image/color"
	"image/draw"
	"math"
)

// barChart draws groups of bars on a logarithmic y axis: one group per
// figure (full sync, an endpoint change …), one bar per proxy.
type barChart struct {
	title, yLabel string
	groups        []string
	bars          []barSeries
	yFormat       func(float64) string
	w             int
}

// barSeries is one proxy's bars, a value per group: NaN when not measured;
// open bars are lower bounds (the step was stopped at its time limit) and
// are drawn hollow.
type barSeries struct {
	name  string
	color color.RGBA
	ys    []float64
	open  []bool
}

func (c barChart) legend() []series {
	out := make([]series, len(c.bars))
	for i, b := range c.bars {
		out[i] = series{name: b.name, color: b.color}
	}
	return out
}

func (c barChart) hasTargets() bool { return false }
func (c barChart) width() int       { return c.w }

func (c barChart) draw(img *image.RGBA, r image.Rectangle) {
	plot := image.Rect(r.Min.X+marginLeft, r.Min.Y+marginTop, r.Max.X-marginRight, r.Max.Y-marginBot)
	drawText(img, r.Min.X+(r.Dx()-textWidth(c.title, textScale))/2, r.Min.Y+12, c.title, textScale, black, false)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, b := range c.bars {
		for _, y := range b.ys {
			if !math.IsNaN(y) && y > 0 {
				ymin, ymax = math.Min(ymin, y), math.Max(ymax, y)
			}
		}
	}
	if math.IsInf(ymin, 0) {
		drawText(img, plot.Min.X+20, plot.Min.Y+20, "no data", textScale, gray, false)
		return
	}
	py := logYAxis(img, plot, ymin, ymax, c.yFormat)
	rect(img, plot, gray)
	drawText(img, r.Min.X+12, plot.Min.Y+(plot.Dy()+textWidth(c.yLabel, textScale))/2, c.yLabel, textScale, black, true)

	band := plot.Dx() / max(1, len(c.groups))
	barW := band / (len(c.bars) + 1)
	for g, name := range c.groups {
		x0 := plot.Min.X + g*band
		drawText(img, x0+(band-textWidth(name, textScale))/2, plot.Max.Y+10, name, textScale, black, false)
		for i, b := range c.bars {
			y := b.ys[g]
			if math.IsNaN(y) || y <= 0 {
				continue
			}
			bx := x0 + barW/2 + i*barW
			top := py(y)
			box := image.Rect(bx+1, top, bx+barW-1, plot.Max.Y)
			if b.open[g] {
				rect(img, box, b.color)
				rect(img, box.Inset(1), b.color)
				continue
			}
			draw.Draw(img, box, &image.Uniform{b.color}, image.Point{}, draw.Src)
		}
	}
}
