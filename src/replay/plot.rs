//! The replay's picture of a recorded run: every slot's seed stage as a swimlane over the run's steps
//! (epochs across rounds), with marks where seeds germinate, fossilize and are pruned, and below it the
//! mean validation accuracy and the mean raw return so far in the round. SVG or PNG, by extension.
//!
//! Text in a PNG is drawn by plotters' `ab_glyph` feature, which reads no system fonts: the font is
//! bundled ([`FONT`]) and registered once under the family name every text style here uses. The same
//! registration also serves the SVG backend, which measures text with it to lay out labels.

use crate::trace::Trace;
use esper_components::{EpisodeReturn, SeedStage};
use esper_systems::write_trace::StepRecord;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::OnceLock;

/// DejaVu Sans (Bitstream Vera / DejaVu license, free to redistribute; its text is in
/// `DejaVuSans-LICENSE.txt` beside the font).
static FONT: &[u8] = include_bytes!("DejaVuSans.ttf");
/// The family name the font is registered under and every text style asks for.
const FAMILY: &str = "sans-serif";

/// Image width; the height grows with the number of lanes.
const WIDTH: u32 = 1400;
const TITLE_PX: u32 = 44;
/// The stage legend is a grid of fixed-width cells (wrapping to more rows on a narrow image).
const LEGEND_ITEM_PX: u32 = 105;
const LEGEND_ROW_PX: u32 = 22;
/// Left label area (lane labels, the accuracy axis) and right one (the return axis): the same in both
/// panels, so that their x axes line up.
const LEFT_PX: u32 = 130;
const RIGHT_PX: u32 = 80;
const MARGIN_PX: u32 = 10;
const X_LABELS_PX: u32 = 36;
/// Above the lanes: the round labels.
const ROUND_LABELS_PX: u32 = 18;
/// A lane is 14 to 28 px tall until the lanes would pass `MAX_LANES_PX`; then they get thinner.
const MIN_LANE_PX: f64 = 14.0;
const MAX_LANE_PX: f64 = 28.0;
const MAX_LANES_PX: f64 = 2400.0;
/// Below this height a lane gets no label of its own (labels name env groups instead).
const LABEL_LANE_PX: f64 = 11.0;
const CURVES_PX: u32 = 320;

const ACC_COLOR: RGBColor = RGBColor(0x1F, 0x4E, 0x9A);
const RETURN_COLOR: RGBColor = RGBColor(0xC0, 0x39, 0x2B);
const BOUNDARY_COLOR: RGBColor = RGBColor(0x40, 0x40, 0x40);

/// A stage's cell colour.
fn stage_color(stage: SeedStage) -> RGBColor {
    match stage {
        SeedStage::Unknown => RGBColor(0xFF, 0xFF, 0xFF),
        SeedStage::Dormant => RGBColor(0xE8, 0xE8, 0xE8),
        SeedStage::Germinated => RGBColor(0xF5, 0xD0, 0x00),
        SeedStage::Training => RGBColor(0xF2, 0x8E, 0x2B),
        SeedStage::Blending => RGBColor(0x9E, 0xCA, 0xE9),
        SeedStage::Holding => RGBColor(0x2F, 0x6F, 0xB5),
        SeedStage::Fossilized => RGBColor(0x2C, 0xA0, 0x2C),
        SeedStage::Pruned => RGBColor(0xD6, 0x27, 0x28),
        SeedStage::Embargoed => RGBColor(0x55, 0x55, 0x55),
        SeedStage::Resetting => RGBColor(0xC9, 0xB8, 0xD9),
    }
}

/// A lifecycle event worth a mark on its lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    Germinate,
    Fossilize,
    Prune,
}

impl Mark {
    const ALL: [Mark; 3] = [Mark::Germinate, Mark::Fossilize, Mark::Prune];

    /// The mark of a slot's events in one step (see [`super::event_mark`]).
    fn of(events: u8) -> Option<Mark> {
        match super::event_mark(events)? {
            'G' => Some(Mark::Germinate),
            'F' => Some(Mark::Fossilize),
            _ => Some(Mark::Prune),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mark::Germinate => "germinate",
            Mark::Fossilize => "fossilize",
            Mark::Prune => "prune",
        }
    }
}

/// Renders `trace` as an SVG (path ends in .svg) or PNG (.png); any other extension is an error.
pub fn render(trace: &Trace, path: &Path) -> Result<(), String> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let svg = match ext.as_deref() {
        Some("svg") => true,
        Some("png") => false,
        _ => return Err(format!("{}: the picture's file name must end in .svg or .png", path.display())),
    };
    register_font()?;
    let layout = Layout::of(trace);
    let size = (WIDTH, layout.height());
    if svg {
        draw(&SVGBackend::new(path, size).into_drawing_area(), trace, &layout)
    } else {
        draw(&BitMapBackend::new(path, size).into_drawing_area(), trace, &layout)
    }
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Registers [`FONT`] as [`FAMILY`], once per process (plotters keeps a global font table).
fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
                .map_err(|_| "the bundled font does not load".to_string())
        })
        .clone()
}

/// The picture's shape, decided before drawing (the image size depends on it).
struct Layout {
    envs: usize,
    slots: usize,
    /// Stage cells are `lane_px` tall.
    lane_px: f64,
    legend_rows: u32,
    /// Whether any stage in the trace is `Unknown` (it is named in the legend only then).
    has_unknown: bool,
}

impl Layout {
    fn of(trace: &Trace) -> Layout {
        // The lanes are what the records hold (a header's count is not trusted to size the image).
        let envs = trace.steps.iter().map(|s| s.envs.len()).max().unwrap_or(0);
        let slots = trace
            .steps
            .iter()
            .flat_map(|s| s.envs.iter().map(|e| e.stages.len()))
            .fold(trace.header.slots.len(), usize::max);
        let lanes = (envs * slots) as f64;
        let mut lane_px = (360.0 / lanes.max(1.0)).clamp(MIN_LANE_PX, MAX_LANE_PX);
        if lanes * lane_px > MAX_LANES_PX {
            lane_px = MAX_LANES_PX / lanes;
        }
        let has_unknown =
            trace.steps.iter().flat_map(|s| &s.envs).any(|e| e.stages.contains(&SeedStage::Unknown));
        let items = legend_stages(has_unknown).len() + Mark::ALL.len();
        let per_row = ((WIDTH - 2 * MARGIN_PX) / LEGEND_ITEM_PX).max(1) as usize;
        let legend_rows = items.div_ceil(per_row) as u32;
        Layout { envs, slots, lane_px, legend_rows, has_unknown }
    }

    fn lanes(&self) -> usize {
        self.envs * self.slots
    }

    fn legend_px(&self) -> u32 {
        self.legend_rows * LEGEND_ROW_PX + 8
    }

    fn swim_px(&self) -> u32 {
        (self.lanes() as f64 * self.lane_px).ceil() as u32 + ROUND_LABELS_PX + X_LABELS_PX + 2 * MARGIN_PX
    }

    fn height(&self) -> u32 {
        TITLE_PX + self.legend_px() + self.swim_px() + CURVES_PX
    }
}

/// The stages the legend names, in lifecycle order.
fn legend_stages(has_unknown: bool) -> Vec<SeedStage> {
    SeedStage::ALL.into_iter().filter(|&s| s != SeedStage::Unknown || has_unknown).collect()
}

fn font(size: f64) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&BLACK)
}

/// Plotters' errors as text (each carries the backend's own error).
fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    trace: &Trace,
    layout: &Layout,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(text)?;
    let h = &trace.header;
    let n = trace.steps.len();
    let planned = h.rounds.saturating_mul(h.epochs);
    let mut title = format!(
        "{} on {}: {} envs, {} rounds \u{d7} {} epochs",
        h.policy, h.task, h.envs, h.rounds, h.epochs
    );
    if n as u64 != planned {
        title.push_str(&format!(" ({n} of {planned} steps recorded)"));
    }
    // A few pixels above the title: ab_glyph draws a glyph's top at the very edge otherwise.
    let body = root.margin(4, 0, 0, 0).titled(&title, font(22.0)).map_err(text)?;
    if n == 0 {
        // Nothing to plot: say so rather than draw empty axes.
        let (w, hgt) = body.dim_in_pixel();
        let style = font(20.0).pos(Pos::new(HPos::Center, VPos::Center));
        body.draw(&Text::new("no steps recorded", (w as i32 / 2, hgt as i32 / 2), style)).map_err(text)?;
        return root.present().map_err(text);
    }
    let (legend, rest) = body.split_vertically(layout.legend_px());
    let (swim, curves) = rest.split_vertically(layout.swim_px());
    draw_legend(&legend, layout)?;
    let steps = &trace.steps;
    // The steps' x: cell `i` spans i - 0.5 .. i + 0.5, so that the integer tick labels sit on cells.
    let x_range = -0.5..n as f64 - 0.5;
    // Where a new round starts (its first step's index).
    let round_starts: Vec<usize> = (1..n).filter(|&i| steps[i].round != steps[i - 1].round).collect();
    draw_swimlanes(root, &swim, steps, &h.slots, layout, x_range.clone(), &round_starts)?;
    draw_curves(&curves, steps, x_range, &round_starts)?;
    root.present().map_err(text)
}

/// One row of colour boxes and mark symbols with their names (wrapping onto more rows when needed).
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, layout: &Layout) -> Result<(), String> {
    let per_row = ((WIDTH - 2 * MARGIN_PX) / LEGEND_ITEM_PX).max(1) as usize;
    let label = font(13.0).pos(Pos::new(HPos::Left, VPos::Center));
    let stages = legend_stages(layout.has_unknown);
    let items = stages.iter().map(|&s| Ok(s)).chain(Mark::ALL.iter().map(|&m| Err(m)));
    for (k, item) in items.enumerate() {
        let x = (MARGIN_PX + (k % per_row) as u32 * LEGEND_ITEM_PX) as i32;
        let y = ((k / per_row) as u32 * LEGEND_ROW_PX + LEGEND_ROW_PX / 2 + 4) as i32;
        let name = match item {
            Ok(stage) => {
                area.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], stage_color(stage).filled()))
                    .map_err(text)?;
                area.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], BLACK.mix(0.4))).map_err(text)?;
                stage.name().to_ascii_lowercase()
            }
            Err(mark) => {
                draw_mark(area, mark, (x + 7, y), 5)?;
                mark.label().to_string()
            }
        };
        area.draw(&Text::new(name, (x + 20, y), label.clone())).map_err(text)?;
    }
    Ok(())
}

/// `mark`'s symbol, centred on `at`, `size` px from centre to tip.
fn draw_mark<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    mark: Mark,
    at: CT::From,
    size: i32,
) -> Result<(), String> {
    let ink = BLACK.filled();
    match mark {
        Mark::Germinate => area.draw(&TriangleMarker::new(at, size, ink)),
        Mark::Fossilize => area.draw(&Circle::new(at, size, ink)),
        // A cross's lines are one pixel wide: it needs the width to show on a red cell.
        Mark::Prune => area.draw(&Cross::new(at, size, BLACK.stroke_width(2))),
    }
    .map_err(text)
}

/// The top panel: one lane per (env, slot), each step a cell in the slot's stage colour.
fn draw_swimlanes<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    steps: &[StepRecord],
    slot_names: &[String],
    layout: &Layout,
    x_range: std::ops::Range<f64>,
    round_starts: &[usize],
) -> Result<(), String> {
    let (envs, slots, lanes) = (layout.envs, layout.slots, layout.lanes());
    let n = steps.len();
    // Lane 0 (env 0, slot 0) is at the top: it spans y = lanes - 1 .. lanes.
    let mut chart = ChartBuilder::on(area)
        .margin(MARGIN_PX)
        .margin_top(MARGIN_PX + ROUND_LABELS_PX)
        .x_label_area_size(X_LABELS_PX)
        .y_label_area_size(LEFT_PX)
        .right_y_label_area_size(RIGHT_PX)
        .build_cartesian_2d(x_range, 0.0..lanes.max(1) as f64)
        .map_err(text)?;
    let step_label = |x: &f64| integer_label(*x);
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_y_axis()
        .y_labels(0)
        .x_labels(n.min(20))
        .x_label_formatter(&step_label)
        .label_style(font(12.0))
        .draw()
        .map_err(text)?;
    if lanes == 0 {
        let style = font(16.0).pos(Pos::new(HPos::Center, VPos::Center));
        let at = chart.backend_coord(&((n as f64 - 1.0) / 2.0, 0.5));
        return root.draw(&Text::new("no slots recorded", at, style)).map_err(text);
    }
    // The real lane height, once the chart has taken its margins.
    let lane_px = {
        let (_, ys) = chart.plotting_area().get_pixel_range();
        (ys.end - ys.start) as f64 / lanes as f64
    };
    // A gap between lanes while there is room for one (in lane units).
    let gap = if lane_px >= 6.0 { 1.0 / lane_px } else { 0.0 };
    let stage_at =
        |i: usize, e: usize, s: usize| steps[i].envs.get(e).and_then(|env| env.stages.get(s)).copied();
    let mut marks: Vec<(Mark, (f64, f64))> = Vec::new();
    for e in 0..envs {
        for s in 0..slots {
            let lane = e * slots + s;
            let (y0, y1) = ((lanes - lane - 1) as f64 + gap, (lanes - lane) as f64 - gap);
            // A run of steps in one stage is one rectangle: a run of 256 envs stays a small SVG.
            let mut start = 0;
            for i in 1..=n {
                if i < n && stage_at(i, e, s) == stage_at(start, e, s) {
                    continue;
                }
                if let Some(stage) = stage_at(start, e, s) {
                    let cell = [(start as f64 - 0.5, y0), (i as f64 - 0.5, y1)];
                    chart.draw_series([Rectangle::new(cell, stage_color(stage).filled())]).map_err(text)?;
                }
                start = i;
            }
            for (i, step) in steps.iter().enumerate() {
                let events = step.envs.get(e).and_then(|r| r.events.get(s)).copied().unwrap_or(0);
                if let Some(mark) = Mark::of(events) {
                    marks.push((mark, (i as f64, (y0 + y1) / 2.0)));
                }
            }
        }
        // A line between envs, while lanes are tall enough for it not to hide them.
        if e > 0 && lane_px >= 4.0 {
            let y = (lanes - e * slots) as f64;
            let line = PathElement::new(vec![(-0.5, y), (n as f64 - 0.5, y)], BLACK.mix(0.5));
            chart.draw_series([line]).map_err(text)?;
        }
    }
    // Marks go on top of every cell; they shrink with the cells (both the lane and the step width).
    let (xs, _) = chart.plotting_area().get_pixel_range();
    let cell_px = (xs.end - xs.start) as f64 / n as f64;
    let size = (lane_px.min(cell_px) * 0.35).clamp(1.0, 6.0) as i32;
    for (mark, at) in marks {
        draw_mark(chart.plotting_area(), mark, at, size)?;
    }
    draw_round_boundaries(&mut chart, round_starts, 0.0, lanes as f64)?;
    // Round labels above the lanes, where a round is wide enough for one.
    let round_style = font(12.0).pos(Pos::new(HPos::Left, VPos::Bottom));
    let mut starts = vec![0];
    starts.extend_from_slice(round_starts);
    for (k, &first) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(n);
        if (end - first) as f64 * cell_px >= 55.0 {
            let (x, y) = chart.backend_coord(&(first as f64 - 0.5, lanes as f64));
            let label = format!("round {}", steps[first].round);
            root.draw(&Text::new(label, (x + 3, y - 3), round_style.clone())).map_err(text)?;
        }
    }
    draw_lane_labels(root, &chart, slot_names, layout, lane_px)
}

/// Labels left of the lanes: "env 3 r0c1" on an env's first lane and the slot alone on the others
/// while lanes are tall enough; otherwise "env 3" centred on its group, for every k-th env so that the
/// labels do not overlap.
fn draw_lane_labels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    slot_names: &[String],
    layout: &Layout,
    lane_px: f64,
) -> Result<(), String> {
    let (envs, slots, lanes) = (layout.envs, layout.slots, layout.lanes());
    let slot_name = |s: usize| slot_names.get(s).cloned().unwrap_or_else(|| format!("slot {s}"));
    let style = font(12.0).pos(Pos::new(HPos::Right, VPos::Center));
    let x0 = chart.x_range().start;
    let at = |lane_mid: f64| {
        let (x, y) = chart.backend_coord(&(x0, lanes as f64 - lane_mid));
        (x - 6, y)
    };
    if lane_px >= LABEL_LANE_PX {
        for e in 0..envs {
            for s in 0..slots {
                let label = if s == 0 { format!("env {e} {}", slot_name(s)) } else { slot_name(s) };
                let lane = (e * slots + s) as f64;
                root.draw(&Text::new(label, at(lane + 0.5), style.clone())).map_err(text)?;
            }
        }
    } else {
        let env_px = lane_px * slots as f64;
        let every = (14.0 / env_px).ceil().max(1.0) as usize;
        for e in (0..envs).step_by(every) {
            let mid = (e * slots) as f64 + slots as f64 / 2.0;
            root.draw(&Text::new(format!("env {e}"), at(mid), style.clone())).map_err(text)?;
        }
    }
    Ok(())
}

/// Thin vertical lines between rounds, from `y0` to `y1` in the chart's coordinates.
fn draw_round_boundaries<DB: DrawingBackend>(
    chart: &mut ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    round_starts: &[usize],
    y0: f64,
    y1: f64,
) -> Result<(), String> {
    let lines = round_starts.iter().map(|&i| {
        PathElement::new(vec![(i as f64 - 0.5, y0), (i as f64 - 0.5, y1)], BOUNDARY_COLOR.stroke_width(1))
    });
    chart.draw_series(lines).map_err(text)?;
    Ok(())
}

/// The bottom panel: the mean val_acc per step and, when there are rewards, the mean raw return so
/// far in the round on the right-hand axis.
fn draw_curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    steps: &[StepRecord],
    x_range: std::ops::Range<f64>,
    round_starts: &[usize],
) -> Result<(), String> {
    let n = steps.len();
    let acc = mean_val_acc(steps);
    let ret = mean_return_so_far(steps);
    let acc_range = padded_range(&acc, false).unwrap_or(0.0..100.0);
    let ret_range = ret.as_deref().and_then(|r| padded_range(r, true)).unwrap_or(0.0..1.0);
    let ret_decimals = decimals(ret_range.end - ret_range.start);
    let mut chart = ChartBuilder::on(area)
        .margin(MARGIN_PX)
        .caption("mean over envs per step", font(15.0))
        .x_label_area_size(X_LABELS_PX)
        .y_label_area_size(LEFT_PX)
        .right_y_label_area_size(RIGHT_PX)
        .build_cartesian_2d(x_range.clone(), acc_range.clone())
        .map_err(text)?
        .set_secondary_coord(x_range, ret_range);
    let step_label = |x: &f64| integer_label(*x);
    let acc_label = |y: &f64| axis_label(*y, 1);
    let ret_label = |y: &f64| axis_label(*y, ret_decimals);
    chart
        .configure_mesh()
        .light_line_style(BLACK.mix(0.05))
        .bold_line_style(BLACK.mix(0.12))
        .x_labels(n.min(20))
        .x_label_formatter(&step_label)
        .y_label_formatter(&acc_label)
        .x_desc("step")
        .y_desc("val_acc (%)")
        .label_style(font(12.0))
        .axis_desc_style(font(13.0))
        .draw()
        .map_err(text)?;
    draw_round_boundaries(&mut chart, round_starts, acc_range.start, acc_range.end)?;
    // Points mark the steps while there are few enough of them to tell apart (and keep a one-step
    // segment visible).
    let point_size = if n <= 80 { 2 } else { 0 };
    let mut labelled = false;
    for (k, segment) in segments(&acc, steps).into_iter().enumerate() {
        let series = chart
            .draw_series(LineSeries::new(segment, ACC_COLOR.stroke_width(2)).point_size(point_size))
            .map_err(text)?;
        if k == 0 {
            series
                .label("mean val_acc (%)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ACC_COLOR.stroke_width(2)));
            labelled = true;
        }
    }
    if let Some(ret) = &ret {
        chart
            .configure_secondary_axes()
            .y_desc("mean raw return so far in round")
            .y_label_formatter(&ret_label)
            .label_style(font(12.0))
            .axis_desc_style(font(13.0))
            .draw()
            .map_err(text)?;
        for (k, segment) in segments(ret, steps).into_iter().enumerate() {
            let series = chart
                .draw_secondary_series(
                    LineSeries::new(segment, RETURN_COLOR.stroke_width(2)).point_size(point_size),
                )
                .map_err(text)?;
            if k == 0 {
                series.label("mean raw return so far in round (right axis)").legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], RETURN_COLOR.stroke_width(2))
                });
                labelled = true;
            }
        }
    }
    if labelled {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(font(12.0))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(text)?;
    }
    Ok(())
}

/// `x` as a step number when it is one (tick positions on a float axis need not be integers).
fn integer_label(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 { format!("{}", x.round() as i64) } else { String::new() }
}

/// Per step, the mean `val_acc` over the envs whose value is finite: one diverged env does not blank
/// the line. NaN when no env has a finite value (the point is skipped).
fn mean_val_acc(steps: &[StepRecord]) -> Vec<f64> {
    steps
        .iter()
        .map(|step| {
            let finite: Vec<f64> = step.envs.iter().map(|e| e.val_acc).filter(|v| v.is_finite()).collect();
            if finite.is_empty() { f64::NAN } else { finite.iter().sum::<f64>() / finite.len() as f64 }
        })
        .collect()
}

/// Per step, the mean over envs of each env's raw reward summed since its round began (a missing or
/// non-finite reward counts as 0; a rollback rewrites the env's rewards since its last one to the death
/// penalty, as the run's `EpisodeReturn` does); None when the trace has no reward at all.
fn mean_return_so_far(steps: &[StepRecord]) -> Option<Vec<f64>> {
    if !steps.iter().flat_map(|s| &s.envs).any(|e| e.reward.is_some()) {
        return None;
    }
    let mut sums: Vec<EpisodeReturn> = Vec::new();
    let mut round = None;
    let mut means = Vec::with_capacity(steps.len());
    for step in steps {
        if round != Some(step.round) {
            sums.clear();
            round = Some(step.round);
        }
        sums.resize(sums.len().max(step.envs.len()), EpisodeReturn::default());
        for (sum, env) in sums.iter_mut().zip(&step.envs) {
            let reward = env.reward.map(|r| if r.is_finite() { r } else { 0.0 });
            super::add_to_return(sum, env.outcome, reward);
        }
        let n = step.envs.len();
        means.push(if n == 0 { f64::NAN } else { sums[..n].iter().map(|r| r.raw).sum::<f64>() / n as f64 });
    }
    Some(means)
}

/// The finite values' range with a margin (0 included when `with_zero`); None when none is finite.
fn padded_range(values: &[f64], with_zero: bool) -> Option<std::ops::Range<f64>> {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let (mut lo, mut hi) =
        finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return None;
    }
    if with_zero {
        (lo, hi) = (lo.min(0.0), hi.max(0.0));
    }
    let pad = ((hi - lo) * 0.08).max(0.5);
    Some(lo - pad..hi + pad)
}

/// `y` with `decimals` decimals, without the "-0.0" a tick a rounding error below zero would get.
fn axis_label(y: f64, decimals: usize) -> String {
    let text = format!("{y:.decimals$}");
    if text.trim_start_matches(['-', '0', '.']).is_empty() { format!("{:.decimals$}", 0.0) } else { text }
}

/// Decimals for axis labels spanning `span`.
fn decimals(span: f64) -> usize {
    if span >= 10.0 {
        0
    } else if span >= 1.0 {
        1
    } else {
        2
    }
}

/// The line's pieces: `values` split at round starts (a new round's hosts start over) and at
/// non-finite values (skipped), as (step, value) points.
fn segments(values: &[f64], steps: &[StepRecord]) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut current = Vec::new();
    for (i, &v) in values.iter().enumerate() {
        let new_round = i > 0 && steps[i].round != steps[i - 1].round;
        if (new_round || !v.is_finite()) && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        if v.is_finite() {
            current.push((i as f64, v));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{TraceEnd, TraceHeader, test_header};
    use esper_systems::write_trace::{EVENT_FOSSILIZED, EVENT_GERMINATED, EVENT_PRUNED, EnvStep};
    use std::path::PathBuf;

    const ENVS: usize = 2;
    const SLOTS: usize = 2;
    const ROUNDS: u64 = 2;
    const EPOCHS: u64 = 6;

    fn trace(header: TraceHeader, steps: Vec<StepRecord>) -> Trace {
        Trace {
            version: 1,
            header,
            steps,
            end: TraceEnd::Truncated { chunks: 0, offset: 0, partial_bytes: 0 },
            records: 0..0,
        }
    }

    /// 2 envs × 2 slots × 2 rounds × 6 epochs. Env 0 slot 0 goes germinated → training → blending →
    /// fossilized in round 0; env 1 slot 1 germinates and is pruned in round 1; one val_acc is NaN and
    /// one env rolls back (no reward).
    fn small_trace() -> Trace {
        use SeedStage::*;
        let lane00 = [Dormant, Germinated, Training, Blending, Holding, Fossilized];
        let lane11 = [Dormant, Germinated, Training, Pruned, Embargoed, Resetting];
        let mut steps = Vec::new();
        for round in 0..ROUNDS {
            for epoch in 1..=EPOCHS {
                let step = round * EPOCHS + epoch - 1;
                let e = (epoch - 1) as usize;
                let envs = (0..ENVS)
                    .map(|env| {
                        let mut stages = vec![Dormant; SLOTS];
                        let mut events = vec![0u8; SLOTS];
                        if round == 0 && env == 0 {
                            stages[0] = lane00[e];
                            events[0] = [0, EVENT_GERMINATED, 0, 0, 0, EVENT_FOSSILIZED][e];
                        }
                        if round == 1 && env == 1 {
                            stages[1] = lane11[e];
                            events[1] = [0, EVENT_GERMINATED, 0, EVENT_PRUNED, 0, 0][e];
                        }
                        EnvStep {
                            stages,
                            events,
                            alphas: vec![0.0; SLOTS],
                            val_acc: if step == 3 && env == 0 { f64::NAN } else { 40.0 + step as f64 },
                            reward: if epoch == 4 && env == 1 { None } else { Some(0.1 * env as f64 - 0.02) },
                            ..EnvStep::default()
                        }
                    })
                    .collect();
                steps.push(StepRecord { round, epoch, step, envs });
            }
        }
        trace(test_header(ENVS as u64, SLOTS, ROUNDS, EPOCHS), steps)
    }

    /// A fresh directory for one test's files.
    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("esper-plot-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    fn png_width(bytes: &[u8]) -> u32 {
        u32::from_be_bytes(bytes[16..20].try_into().unwrap())
    }

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1A, b'\n'];

    #[test]
    fn svg_has_stage_colours_marks_and_title() {
        let dir = temp_dir("svg");
        let path = dir.join("run.svg");
        render(&small_trace(), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(80)]);
        for stage in [SeedStage::Fossilized, SeedStage::Pruned, SeedStage::Training] {
            assert!(svg.contains(&hex(stage_color(stage))), "no {} colour", stage.name());
        }
        assert!(svg.contains("heuristic on cifar_baseline: 2 envs, 2 rounds \u{d7} 6 epochs"));
        // plotters writes each text on a line of its own.
        assert!(svg.contains("\nenv 1 r0c0\n") && svg.contains("\nr0c1\n"), "lane labels");
        assert!(svg.contains("round 1"), "round label");
        assert!(svg.contains("mean raw return so far in round"), "return axis");
        // The marks come from the recorded events: without them, two triangles (germinations) and one
        // dot (the fossilization) fewer, and the prune's × strokes gone.
        let mut quiet = small_trace();
        quiet.steps.iter_mut().flat_map(|s| s.envs.iter_mut()).for_each(|e| e.events.fill(0));
        let bare = dir.join("bare.svg");
        render(&quiet, &bare).unwrap();
        let bare = std::fs::read_to_string(&bare).unwrap();
        let count = |text: &str, tag: &str| text.matches(tag).count();
        assert_eq!(count(&svg, "<polygon") - count(&bare, "<polygon"), 2, "germinate triangles");
        assert_eq!(count(&svg, "<circle") - count(&bare, "<circle"), 1, "fossilize dot");
        assert!(
            count(&svg, "<polyline") + count(&svg, "<line")
                > count(&bare, "<polyline") + count(&bare, "<line")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn png_has_signature_and_width() {
        let dir = temp_dir("png");
        let path = dir.join("run.png");
        render(&small_trace(), &path).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(png[..8], PNG_SIGNATURE);
        assert_eq!(png_width(&png), WIDTH);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn unknown_extension_is_an_error() {
        let dir = temp_dir("ext");
        for name in ["run.jpg", "run"] {
            let err = render(&small_trace(), &dir.join(name)).unwrap_err();
            assert!(err.contains(".svg or .png"), "{err}");
            assert!(!dir.join(name).exists());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn empty_trace_says_so() {
        let dir = temp_dir("empty");
        let empty = trace(test_header(4, 3, 2, 10), Vec::new());
        render(&empty, &dir.join("run.svg")).unwrap();
        render(&empty, &dir.join("run.png")).unwrap();
        let svg = std::fs::read_to_string(dir.join("run.svg")).unwrap();
        assert!(svg.contains("no steps recorded"));
        assert!(svg.contains("(0 of 20 steps recorded)"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn many_envs_and_degenerate_traces_render() {
        let dir = temp_dir("many");
        // 256 envs × 3 slots × 40 epochs: thin lanes, labels on some envs only.
        let steps = (0..40u64)
            .map(|i| StepRecord {
                round: 0,
                epoch: i + 1,
                step: i,
                envs: (0..256)
                    .map(|e| EnvStep {
                        stages: vec![SeedStage::ALL[(i as usize / 5 + e) % SeedStage::ALL.len()]; 3],
                        val_acc: f64::NAN,
                        ..EnvStep::default()
                    })
                    .collect(),
            })
            .collect();
        let many = trace(test_header(256, 3, 1, 40), steps);
        render(&many, &dir.join("many.svg")).unwrap();
        render(&many, &dir.join("many.png")).unwrap();
        // One env, no slots, one step.
        let one = StepRecord {
            round: 0,
            epoch: 1,
            step: 0,
            envs: vec![EnvStep { val_acc: 10.0, ..EnvStep::default() }],
        };
        render(&trace(test_header(1, 0, 1, 1), vec![one]), &dir.join("one.svg")).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn return_so_far_resets_each_round_and_counts_none_as_zero() {
        let t = small_trace();
        let ret = mean_return_so_far(&t.steps).unwrap();
        // Env 0 earns -0.02 a step, env 1 0.08 (none at epoch 4).
        assert!((ret[0] - 0.03).abs() < 1e-12);
        assert!((ret[3] - (-0.08 + 0.24) / 2.0).abs() < 1e-12);
        assert!((ret[6] - 0.03).abs() < 1e-12, "a new round starts over");
        let acc = mean_val_acc(&t.steps);
        assert_eq!(acc[3], 43.0, "the NaN env is left out");
        assert_eq!(segments(&acc, &t.steps).len(), 2, "one line per round");
        assert_eq!(axis_label(-1e-17, 1), "0.0");
        assert_eq!(axis_label(-0.3, 1), "-0.3");
    }
}
