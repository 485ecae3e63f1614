//! Dominant colours (median cut, refined by k-means) and mean brightness of an RGBA image.
//! Both are deterministic: the same pixels give the same answer on every run.

use image::RgbaImage;
use imagepipe_contracts::step::DominantColor;

/// Most pixels the colour analysis looks at; larger images are sampled on a regular grid.
const MAX_SAMPLES: usize = 16_384;
/// Pixels at least this opaque count towards the colours.
const MIN_ALPHA: u8 = 128;
/// Most k-means refinement rounds after the median cut.
const KMEANS_ROUNDS: usize = 10;

/// The `count` most common colours of `image` and their share of its (opaque) pixels, most common
/// first; fewer when the image has fewer distinct colours, none when it is fully transparent.
pub fn dominant_colors(image: &RgbaImage, count: usize) -> Vec<DominantColor> {
    let pixels = samples(image);
    if pixels.is_empty() || count == 0 {
        return Vec::new();
    }
    let centres = median_cut(pixels.clone(), count);
    let (centres, members) = kmeans(&pixels, centres);

    let total = pixels.len() as f64;
    let mut colors: Vec<(String, usize)> = Vec::new();
    for (centre, n) in centres.iter().zip(members).filter(|(_, n)| *n > 0) {
        let hex = format!("#{:02x}{:02x}{:02x}", channel(centre[0]), channel(centre[1]), channel(centre[2]));
        match colors.iter_mut().find(|(h, _)| *h == hex) {
            Some((_, existing)) => *existing += n,
            None => colors.push((hex, n)),
        }
    }
    colors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    colors.into_iter().map(|(hex, n)| DominantColor { hex, share: n as f64 / total }).collect()
}

/// Mean Rec. 709 luma of `image`, 0 (black) to 1 (white), each pixel weighted by its opacity;
/// 0 for a fully transparent image.
pub fn mean_brightness(image: &RgbaImage) -> f64 {
    let (mut luma, mut weight) = (0.0, 0.0);
    for pixel in image.pixels() {
        let [r, g, b, a] = pixel.0;
        let alpha = f64::from(a) / 255.0;
        luma += alpha * (0.2126 * f64::from(r) + 0.7152 * f64::from(g) + 0.0722 * f64::from(b)) / 255.0;
        weight += alpha;
    }
    if weight == 0.0 { 0.0 } else { (luma / weight).clamp(0.0, 1.0) }
}

fn channel(value: f64) -> u8 {
    value.round().clamp(0.0, 255.0) as u8
}

/// Opaque pixels of `image`, every `step`-th in each direction so at most [`MAX_SAMPLES`].
fn samples(image: &RgbaImage) -> Vec<[u8; 3]> {
    let (width, height) = image.dimensions();
    let total = width as usize * height as usize;
    let step = (total as f64 / MAX_SAMPLES as f64).sqrt().ceil().max(1.0) as u32;
    let mut pixels = Vec::with_capacity(total.min(MAX_SAMPLES));
    for y in (0..height).step_by(step as usize) {
        for x in (0..width).step_by(step as usize) {
            let [r, g, b, a] = image.get_pixel(x, y).0;
            if a >= MIN_ALPHA {
                pixels.push([r, g, b]);
            }
        }
    }
    pixels
}

/// Splits the colour space into at most `count` boxes, always cutting the box with the most
/// pixels × widest channel range at the median of that channel; returns the boxes' means.
fn median_cut(mut pixels: Vec<[u8; 3]>, count: usize) -> Vec<[f64; 3]> {
    let mut boxes = Vec::with_capacity(count);
    boxes.push(0..pixels.len());
    while boxes.len() < count {
        let best = boxes
            .iter()
            .enumerate()
            .map(|(i, range)| {
                let (channel, spread) = widest_channel(&pixels[range.clone()]);
                (i, channel, spread, spread as usize * range.len())
            })
            .filter(|&(_, _, spread, _)| spread > 0)
            .max_by_key(|&(i, _, _, score)| (score, std::cmp::Reverse(i)));
        let Some((index, channel, _, _)) = best else { break };
        let range = boxes[index].clone();
        let slice = &mut pixels[range.clone()];
        slice.sort_unstable_by_key(|p| (p[channel], p[0], p[1], p[2]));
        let split = split_point(slice, channel);
        boxes[index] = range.start..range.start + split;
        boxes.push(range.start + split..range.end);
    }
    boxes.into_iter().map(|range| mean(&pixels[range])).collect()
}

fn widest_channel(pixels: &[[u8; 3]]) -> (usize, u8) {
    (0..3)
        .map(|c| {
            let (min, max) = pixels.iter().fold((u8::MAX, 0), |(lo, hi), p| (lo.min(p[c]), hi.max(p[c])));
            (c, max.saturating_sub(min))
        })
        .max_by_key(|&(c, spread)| (spread, std::cmp::Reverse(c)))
        .expect("three channels")
}

/// The index nearest the middle of `sorted` where `channel` changes value, so equal colours stay
/// in one box. `sorted` has at least two values in `channel`.
fn split_point(sorted: &[[u8; 3]], channel: usize) -> usize {
    let middle = sorted.len() / 2;
    let changes = |i: &usize| *i > 0 && *i < sorted.len() && sorted[i - 1][channel] != sorted[*i][channel];
    (0..sorted.len())
        .flat_map(|d| [middle + d, middle.wrapping_sub(d)])
        .find(changes)
        .expect("a channel with a spread changes value somewhere")
}

fn mean(pixels: &[[u8; 3]]) -> [f64; 3] {
    let mut sum = [0.0; 3];
    for p in pixels {
        for c in 0..3 {
            sum[c] += f64::from(p[c]);
        }
    }
    sum.map(|s| s / pixels.len().max(1) as f64)
}

/// Lloyd's k-means from `centres` until no pixel changes cluster (or [`KMEANS_ROUNDS`]); returns
/// the centres and how many pixels each holds.
fn kmeans(pixels: &[[u8; 3]], mut centres: Vec<[f64; 3]>) -> (Vec<[f64; 3]>, Vec<usize>) {
    let mut assignment = vec![usize::MAX; pixels.len()];
    for _ in 0..KMEANS_ROUNDS {
        let mut changed = false;
        let mut sums = vec![[0.0; 3]; centres.len()];
        let mut counts = vec![0usize; centres.len()];
        for (pixel, assigned) in pixels.iter().zip(assignment.iter_mut()) {
            let nearest = nearest(&centres, pixel);
            changed |= nearest != *assigned;
            *assigned = nearest;
            counts[nearest] += 1;
            for c in 0..3 {
                sums[nearest][c] += f64::from(pixel[c]);
            }
        }
        for ((centre, sum), n) in centres.iter_mut().zip(&sums).zip(&counts) {
            if *n > 0 {
                *centre = sum.map(|s| s / *n as f64);
            }
        }
        if !changed {
            return (centres, counts);
        }
    }
    let mut counts = vec![0usize; centres.len()];
    for pixel in pixels {
        counts[nearest(&centres, pixel)] += 1;
    }
    (centres, counts)
}

fn nearest(centres: &[[f64; 3]], pixel: &[u8; 3]) -> usize {
    let distance = |centre: &[f64; 3]| (0..3).map(|c| (centre[c] - f64::from(pixel[c])).powi(2)).sum::<f64>();
    (0..centres.len())
        .min_by(|&a, &b| distance(&centres[a]).total_cmp(&distance(&centres[b])))
        .expect("at least one centre")
}

#[cfg(test)]
mod tests {
    use image::Rgba;

    use super::*;

    /// An image of vertical stripes: each `(colour, columns)` in turn, 10 rows high.
    fn stripes(parts: &[([u8; 4], u32)]) -> RgbaImage {
        let width = parts.iter().map(|p| p.1).sum();
        RgbaImage::from_fn(width, 10, |x, _| {
            let mut edge = 0;
            for (colour, columns) in parts {
                edge += columns;
                if x < edge {
                    return Rgba(*colour);
                }
            }
            unreachable!()
        })
    }

    #[test]
    fn three_flat_colours_come_back_exactly_with_their_shares() {
        let image = stripes(&[([255, 0, 0, 255], 50), ([0, 0, 255, 255], 30), ([255, 255, 255, 255], 20)]);
        let colors = dominant_colors(&image, 5);
        let got: Vec<(&str, f64)> = colors.iter().map(|c| (c.hex.as_str(), c.share)).collect();
        assert_eq!(got, [("#ff0000", 0.5), ("#0000ff", 0.3), ("#ffffff", 0.2)]);
    }

    #[test]
    fn seven_colours_are_reduced_to_five_and_shares_add_up() {
        let parts: Vec<([u8; 4], u32)> =
            [[250, 10, 10], [10, 250, 10], [10, 10, 250], [240, 240, 20], [20, 240, 240], [245, 250, 245], [5, 5, 5]]
                .iter()
                .enumerate()
                .map(|(i, [r, g, b])| ([*r, *g, *b, 255], 10 + 5 * i as u32))
                .collect();
        let colors = dominant_colors(&stripes(&parts), 5);
        assert_eq!(colors.len(), 5);
        let total: f64 = colors.iter().map(|c| c.share).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        assert!(colors.windows(2).all(|w| w[0].share >= w[1].share), "{colors:?}");
        // The largest stripe (black, 40 of 175 columns) is its own cluster.
        assert_eq!((colors[0].hex.as_str(), colors[0].share), ("#050505", 40.0 / 175.0));
        assert_eq!(dominant_colors(&stripes(&parts), 5), colors, "deterministic");
    }

    #[test]
    fn noise_around_two_colours_splits_into_them() {
        let image = RgbaImage::from_fn(100, 100, |x, y| {
            let jitter = ((x * 7 + y * 13) % 9) as u8;
            if x < 60 { Rgba([200 + jitter, 100, 4 + jitter, 255]) } else { Rgba([20, 60 + jitter, 120, 255]) }
        });
        let colors = dominant_colors(&image, 5);
        let red = |c: &&DominantColor| u8::from_str_radix(&c.hex[1..3], 16).unwrap();
        let warm: f64 = colors.iter().filter(|c| (200..=208).contains(&red(c))).map(|c| c.share).sum();
        let cool: f64 = colors.iter().filter(|c| red(c) == 20).map(|c| c.share).sum();
        assert!((warm - 0.6).abs() < 1e-9 && (cool - 0.4).abs() < 1e-9, "{colors:?}");
    }

    #[test]
    fn transparent_pixels_are_not_colours() {
        let image = stripes(&[([0, 255, 0, 255], 25), ([255, 0, 0, 0], 75)]);
        let colors = dominant_colors(&image, 5);
        assert_eq!(colors, [DominantColor { hex: "#00ff00".into(), share: 1.0 }]);
        assert!(dominant_colors(&stripes(&[([1, 2, 3, 0], 4)]), 5).is_empty());
    }

    #[test]
    fn brightness_is_the_mean_luma() {
        let white = stripes(&[([255, 255, 255, 255], 4)]);
        let black = stripes(&[([0, 0, 0, 255], 4)]);
        let half = stripes(&[([255, 255, 255, 255], 4), ([0, 0, 0, 255], 4)]);
        let red = stripes(&[([255, 0, 0, 255], 4)]);
        assert!((mean_brightness(&white) - 1.0).abs() < 1e-12);
        assert_eq!(mean_brightness(&black), 0.0);
        assert!((mean_brightness(&half) - 0.5).abs() < 1e-12);
        assert!((mean_brightness(&red) - 0.2126).abs() < 1e-12);
        // Transparent pixels do not count; a fully transparent image is dark.
        let white_and_clear = stripes(&[([255, 255, 255, 255], 4), ([0, 0, 0, 0], 4)]);
        assert!((mean_brightness(&white_and_clear) - 1.0).abs() < 1e-12);
        assert_eq!(mean_brightness(&stripes(&[([255, 255, 255, 0], 4)])), 0.0);
    }
}
