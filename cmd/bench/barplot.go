package main

import (
	"image"
	"image/color"
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

func (c barChart) draw(cv *canvas, x0 int) (int, []series, bool) {
	legend := make([]series, len(c.bars))
	var ys []float64
	for i, b := range c.bars {
		legend[i] = series{name: b.name, color: b.color}
		for _, y := range b.ys {
			if y > 0 { // measured, not NaN
				ys = append(ys, y)
			}
		}
	}
	plot, py := axes(cv, x0, c.w, c.title, c.yLabel, ys, c.yFormat)
	if py == nil {
		return c.w, legend, false
	}
	band := plot.Dx() / max(1, len(c.groups))
	barW := band / (len(c.bars) + 1)
	for g, name := range c.groups {
		x0 := plot.Min.X + g*band
		cv.text(x0+band/2, plot.Max.Y+24, `text-anchor="middle"`, name)
		for i, b := range c.bars {
			if y := b.ys[g]; y > 0 { // not NaN
				bx := x0 + barW/2 + i*barW
				cv.rect(image.Rect(bx+1, py(y), bx+barW-1, plot.Max.Y), b.color, b.open[g])
			}
		}
	}
	return c.w, legend, false
}
