//! `zerostream plot`: training curves from `--metrics` files — loss (and validation loss, where the rows
//! have it) against tokens seen, the learning rate and tokens/s against the step — several runs
//! overlaid, one colour each, as one SVG (plotters).

use std::path::Path;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;

/// One run's rows: (step, tokens seen after the step, loss, val_loss, lr, tokens/s).
pub struct Curve {
    pub label: String,
    pub points: Vec<Point>,
}

#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub step: f64,
    pub tokens: f64,
    pub loss: f64,
    pub val_loss: Option<f64>,
    pub lr: f64,
    pub tokens_per_s: f64,
}

/// Reads a metrics file (one JSON object per step); a malformed line is an error naming the file and line.
pub fn read_metrics(path: &Path) -> Result<Curve> {
    // A device or pipe could be read forever (/dev/zero): only regular files are metrics.
    if !std::fs::metadata(path).with_context(|| format!("metrics {}", path.display()))?.is_file() {
        bail!("metrics {}: not a regular file", path.display());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading metrics {}", path.display()))?;
    let mut points = Vec::new();
    let mut tokens = 0.0;
    let lines: Vec<(usize, &str)> = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
    for (n, &(i, line)) in lines.iter().enumerate() {
        let row: serde_json::Value = match serde_json::from_str(line) {
            Ok(row) => row,
            // A last line without its newline, cut off by a crash mid-write (a resume drops it too).
            Err(_) if n + 1 == lines.len() && !text.ends_with('\n') && n > 0 => {
                eprintln!("warning: {} line {}: cut off (no newline), left out", path.display(), i + 1);
                break;
            }
            Err(e) => return Err(e).with_context(|| format!("{} line {}: not a JSON object", path.display(), i + 1)),
        };
        let num = |key: &str| row[key].as_f64().with_context(|| format!("{} line {}: no number \"{key}\"", path.display(), i + 1));
        if row["final_validation"] == true {
            // The validation after the last step: no training, no tokens.
            let nan = f64::NAN;
            points.push(Point { step: num("step")?, tokens, loss: nan, val_loss: Some(num("val_loss")?), lr: nan, tokens_per_s: nan });
            continue;
        }
        // Older files have no "tokens": then steps stand in for tokens.
        tokens += row["tokens"].as_f64().unwrap_or(1.0);
        points.push(Point {
            step: num("step")?,
            tokens,
            // A step whose loss was not finite (a diverged run) writes null: a gap in the curve.
            loss: if row["loss"].is_null() && row.get("loss").is_some() { f64::NAN } else { num("loss")? },
            val_loss: row["val_loss"].as_f64(),
            lr: num("lr")?,
            tokens_per_s: num("tokens_per_s")?,
        });
    }
    if points.is_empty() {
        bail!("metrics {}: no rows", path.display());
    }
    let label = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
    Ok(Curve { label, points })
}

/// The axis over `values`, 5% wider on each side: of their spread, or of the one value a one-row
/// file has (half a unit about zero).
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.filter(|v| v.is_finite()).fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 0.0..1.0;
    }
    let pad = match hi - lo {
        spread if spread > hi.abs() * 1e-9 => spread * 0.05,
        _ if hi != 0.0 => hi.abs() * 0.05,
        _ => 0.5,
    };
    (lo - pad)..(hi + pad)
}

/// Tick labels of a value axis over `range`: as many decimals as a tenth of its span needs ("0.00105",
/// never "0.001" five times), and no "-0".
fn decimal_labels(range: &std::ops::Range<f64>) -> impl Fn(&f64) -> String + use<> {
    let span = range.end - range.start;
    let decimals = (-(span / 10.0).log10().floor()).clamp(0.0, 12.0) as usize;
    move |v| if v.abs() < span * 1e-9 { format!("{:.decimals$}", 0.0) } else { format!("{v:.decimals$}") }
}

/// Tick labels of a count axis (steps, tokens): whole numbers only, blank between them.
fn whole_labels(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-6 { format!("{}", v.round() as i64) } else { String::new() }
}

/// Draws `curves` into the SVG file `out`: loss against tokens on top, learning rate and tokens/s below.
pub fn plot(curves: &[Curve], out: &Path) -> Result<()> {
    let root = SVGBackend::new(out, (1100, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(440);
    let lower = bottom.split_evenly((1, 2));
    let all = || curves.iter().flat_map(|c| c.points.iter());
    let losses = range(all().flat_map(|p| std::iter::once(p.loss).chain(p.val_loss)));
    let loss_labels = decimal_labels(&losses);
    let mut loss = ChartBuilder::on(&top)
        .caption("loss (solid: training, dashed: validation) against tokens seen", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(range(all().map(|p| p.tokens)), losses)?;
    loss.configure_mesh().x_desc("tokens").y_desc("loss").x_label_formatter(&whole_labels).y_label_formatter(&loss_labels).draw()?;
    for (i, c) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // A run of finite losses per line: a diverged step (null) leaves a gap, not a bridge.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for p in &c.points {
            match (p.loss.is_finite(), runs.last_mut()) {
                (true, Some(run)) => run.push((p.tokens, p.loss)),
                (false, Some(run)) if !run.is_empty() => runs.push(Vec::new()),
                _ => {}
            }
        }
        for (j, run) in runs.into_iter().enumerate() {
            let series = loss.draw_series(LineSeries::new(run, color.stroke_width(2)))?;
            if j == 0 {
                series.label(c.label.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
        }
        let val: Vec<(f64, f64)> = c.points.iter().filter_map(|p| p.val_loss.map(|v| (p.tokens, v))).collect();
        if !val.is_empty() {
            loss.draw_series(DashedLineSeries::new(val.clone(), 6, 4, color.stroke_width(2)))?;
            loss.draw_series(val.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
    }
    loss.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    type Pick = fn(&Point) -> f64;
    let panels: [(&str, Pick); 2] = [("learning rate", |p| p.lr), ("tokens/s", |p| p.tokens_per_s)];
    for (area, (title, pick)) in lower.iter().zip(panels) {
        let values = range(all().map(pick));
        let labels = decimal_labels(&values);
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title} against the step"), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(range(all().map(|p| p.step)), values)?;
        chart.configure_mesh().x_desc("step").x_label_formatter(&whole_labels).y_label_formatter(&labels).draw()?;
        for (i, c) in curves.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let finite = c.points.iter().map(|p| (p.step, pick(p))).filter(|(_, y)| y.is_finite());
            chart.draw_series(LineSeries::new(finite, color.stroke_width(2)))?;
        }
    }
    root.present().with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_files_plot_and_bad_lines_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("run.jsonl");
        let rows: String = (0..5)
            .map(|s| {
                let val = if s % 2 == 0 { format!(r#","val_loss":{}"#, 5.0 - s as f64 * 0.4) } else { String::new() };
                format!("{{\"step\":{s},\"tokens\":256,\"loss\":{},\"lr\":0.001,\"tokens_per_s\":1000{val}}}\n", 5.0 - s as f64 * 0.5)
            })
            .collect();
        std::fs::write(&good, rows).unwrap();
        let curve = read_metrics(&good).unwrap();
        assert_eq!((curve.label.as_str(), curve.points.len(), curve.points[4].tokens), ("run", 5, 1280.0));
        assert_eq!(curve.points[2].val_loss, Some(4.2));
        let svg = dir.path().join("loss.svg");
        plot(&[curve], &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg") && text.contains("run") && text.contains("tokens/s"), "{}", &text[..200.min(text.len())]);
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, "{\"step\":0,\"loss\":1,\"lr\":1,\"tokens_per_s\":1}\nnot json\n").unwrap();
        let err = read_metrics(&bad).err().unwrap().to_string();
        assert!(err.contains("bad.jsonl line 2"), "{err}");
        std::fs::write(&bad, "").unwrap();
        assert!(read_metrics(&bad).err().unwrap().to_string().contains("no rows"));
        #[cfg(unix)]
        assert!(read_metrics(Path::new("/dev/zero")).err().unwrap().to_string().contains("not a regular file"));
        // A diverged run's null losses are gaps, not an error; a row without a loss still is one.
        let diverged = dir.path().join("diverged.jsonl");
        std::fs::write(
            &diverged,
            "{\"step\":0,\"loss\":3,\"lr\":1,\"tokens_per_s\":1}\n{\"step\":1,\"loss\":null,\"lr\":1,\"tokens_per_s\":1}\n",
        )
        .unwrap();
        let curve = read_metrics(&diverged).unwrap();
        assert!(curve.points[0].loss == 3.0 && curve.points[1].loss.is_nan());
        plot(&[curve], &dir.path().join("diverged.svg")).unwrap();
        std::fs::write(&bad, "{\"step\":0,\"lr\":1,\"tokens_per_s\":1}\n").unwrap();
        assert!(read_metrics(&bad).err().unwrap().to_string().contains("no number \"loss\""));
        // The final validation's row of its own is a validation point, with no training fields.
        let last = r#"{"step":5,"val_loss":2.5,"val_perplexity":12.18,"final_validation":true}"#;
        std::fs::write(&good, std::fs::read_to_string(&good).unwrap() + last + "\n").unwrap();
        let curve = read_metrics(&good).unwrap();
        let end = curve.points.last().unwrap();
        assert!(end.step == 5.0 && end.tokens == 1280.0 && end.val_loss == Some(2.5) && end.loss.is_nan() && end.lr.is_nan());
        plot(&[curve], &svg).unwrap();
        // A last line cut off by a crash (no newline) is left out; one in the middle is still an error.
        std::fs::write(&bad, "{\"step\":0,\"loss\":1,\"lr\":1,\"tokens_per_s\":1}\n{\"step\": 1").unwrap();
        assert_eq!(read_metrics(&bad).unwrap().points.len(), 1);
    }

    #[test]
    fn a_one_row_file_gets_axes_people_can_read() {
        let dir = tempfile::tempdir().unwrap();
        let (one, svg) = (dir.path().join("one.jsonl"), dir.path().join("one.svg"));
        std::fs::write(&one, "{\"step\":0,\"tokens\":256,\"loss\":10.8,\"lr\":0.001,\"tokens_per_s\":1000}\n").unwrap();
        plot(&[read_metrics(&one).unwrap()], &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        let labels: Vec<&str> = text.split("</text>").filter_map(|t| t.rsplit('>').next()).map(str::trim).collect();
        assert!(!labels.iter().any(|l| l.starts_with("-0")), "{labels:?}");
        // The learning rate's ticks differ from each other; the step's are whole.
        let lr: Vec<&&str> = labels.iter().filter(|l| l.starts_with("0.00")).collect();
        assert!(lr.len() > 2 && lr.windows(2).all(|w| w[0] != w[1]), "{labels:?}");
        assert!(labels.contains(&"0") && !labels.iter().any(|l| l.starts_with("0.") && l.len() < 4), "{labels:?}");
        assert_eq!(whole_labels(&3.0), "3");
        assert_eq!(whole_labels(&2.5), "");
    }
}
