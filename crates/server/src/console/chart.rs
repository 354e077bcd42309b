//! The dashboard's bar chart, laid out on the server: per day, a bar of
//! issuances beside a bar of failures, scaled to the busiest day. The
//! template draws it as SVG; only numbers come from here.

use serde::Serialize;

const WIDTH: i64 = 700;
const HEIGHT: i64 = 160;
/// Room under the bars for the day labels.
const FOOT: i64 = 20;

#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    pub width: i64,
    pub height: i64,
    /// The busiest day's count, the top of the scale.
    pub max: i64,
    pub bars: Vec<Bar>,
    pub labels: Vec<Label>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Bar {
    /// `issued` or `failed` (the CSS class).
    pub kind: &'static str,
    pub day: String,
    pub count: i64,
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Label {
    pub x: i64,
    pub y: i64,
    pub text: String,
}

pub fn build(days: &[String], issued: &[i64], failed: &[i64]) -> Chart {
    let max = issued
        .iter()
        .chain(failed)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let slot = WIDTH / i64::try_from(days.len().max(1)).unwrap_or(1);
    let bar = (slot - 6) / 2;
    let plot = HEIGHT - FOOT;
    let mut bars = Vec::new();
    let mut labels = Vec::new();
    for (i, day) in days.iter().enumerate() {
        let left = i64::try_from(i).unwrap_or(0) * slot + 3;
        for (offset, kind, count) in [
            (0, "issued", issued.get(i).copied().unwrap_or(0)),
            (bar, "failed", failed.get(i).copied().unwrap_or(0)),
        ] {
            // At least one pixel for a day with any: it must be visible.
            let height = match count {
                0 => 0,
                n => (n * plot / max).max(1),
            };
            bars.push(Bar {
                kind,
                day: day.clone(),
                count,
                x: left + offset,
                y: plot - height,
                width: bar,
                height,
            });
        }
        labels.push(Label {
            x: left + bar,
            y: HEIGHT - 5,
            // "MM-DD" of "YYYY-MM-DD".
            text: day.get(5..).unwrap_or(day).to_owned(),
        });
    }
    Chart {
        width: WIDTH,
        height: HEIGHT,
        max,
        bars,
        labels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_day_fills_the_plot_and_a_day_with_one_still_shows() {
        let days: Vec<String> = (1..=3).map(|d| format!("2026-12-0{d}")).collect();
        let chart = build(&days, &[0, 100, 1], &[2, 0, 0]);
        assert_eq!(chart.max, 100);
        let of = |kind: &str, day: usize| {
            chart
                .bars
                .iter()
                .find(|b| b.kind == kind && b.day == days[day])
                .unwrap()
                .clone()
        };
        assert_eq!(of("issued", 1).height, HEIGHT - FOOT);
        assert_eq!(of("issued", 1).y, 0);
        assert_eq!(of("issued", 2).height, 1);
        assert_eq!(of("issued", 0).height, 0);
        assert_eq!(of("failed", 0).height, 2 * (HEIGHT - FOOT) / 100);
        assert_eq!(chart.labels[0].text, "12-01");
        assert!(chart.bars.iter().all(|b| b.x + b.width <= WIDTH));
    }
}
