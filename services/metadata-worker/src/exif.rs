//! The EXIF fields imagepipe reports, read from a raw EXIF block (a TIFF structure) with
//! `kamadak-exif`.

use exif::{Field, In, Rational, Reader, Tag, Value};
use imagepipe_contracts::step::Exif;

/// Reads the fields of [`Exif`] from a raw EXIF block. `Ok(None)` when the block holds none of
/// them; an error when the block is not EXIF at all.
pub fn parse(raw: Vec<u8>) -> Result<Option<Exif>, exif::Error> {
    let exif = Reader::new().read_raw(raw)?;
    let field = |tag| exif.get_field(tag, In::PRIMARY);
    let text = |tag| field(tag).and_then(ascii);

    let found = Exif {
        make: text(Tag::Make),
        model: text(Tag::Model),
        lens: text(Tag::LensModel),
        date_time_original: text(Tag::DateTimeOriginal),
        exposure_time: field(Tag::ExposureTime).and_then(first_rational).and_then(exposure),
        iso: field(Tag::PhotographicSensitivity).and_then(|f| f.value.get_uint(0)).filter(|&iso| iso > 0),
        focal_length_mm: field(Tag::FocalLength).and_then(first_rational).and_then(ratio),
        orientation: field(Tag::Orientation)
            .and_then(|f| f.value.get_uint(0))
            .and_then(|o| u16::try_from(o).ok())
            .filter(|o| (1..=8).contains(o)),
        gps_latitude: coordinate(field(Tag::GPSLatitude), field(Tag::GPSLatitudeRef), b'S', 90.0),
        gps_longitude: coordinate(field(Tag::GPSLongitude), field(Tag::GPSLongitudeRef), b'W', 180.0),
    };
    Ok((found != Exif::default()).then_some(found))
}

/// The first string of an ASCII field, trimmed; `None` when empty or not ASCII.
fn ascii(field: &Field) -> Option<String> {
    let Value::Ascii(strings) = &field.value else { return None };
    let text = String::from_utf8_lossy(strings.first()?);
    let text = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    (!text.is_empty()).then(|| text.to_owned())
}

fn first_rational(field: &Field) -> Option<Rational> {
    match &field.value {
        Value::Rational(values) => values.first().copied(),
        _ => None,
    }
}

fn ratio(r: Rational) -> Option<f64> {
    (r.denom != 0).then(|| f64::from(r.num) / f64::from(r.denom))
}

/// Exposure time as photographers write it: `1/250` below a second, `2` or `2.5` (seconds) above.
fn exposure(r: Rational) -> Option<String> {
    let seconds = ratio(r).filter(|s| *s > 0.0)?;
    if seconds >= 1.0 {
        let text = format!("{seconds:.1}");
        Some(text.strip_suffix(".0").map_or(text.clone(), str::to_owned))
    } else {
        Some(format!("1/{}", (1.0 / seconds).round()))
    }
}

/// Degrees, minutes and seconds with their reference letter as signed decimal degrees;
/// `negative` is the reference letter of the negative hemisphere (`S` or `W`).
fn coordinate(dms: Option<&Field>, reference: Option<&Field>, negative: u8, bound: f64) -> Option<f64> {
    let Value::Rational(parts) = &dms?.value else { return None };
    let [degrees, minutes, seconds] = parts.get(..3)? else { return None };
    let value = ratio(*degrees)? + ratio(*minutes)? / 60.0 + ratio(*seconds)? / 3600.0;
    let letter = reference.and_then(ascii)?.bytes().next()?.to_ascii_uppercase();
    let signed = if letter == negative { -value } else { value };
    (signed.abs() <= bound).then_some(signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure_reads_as_photographers_write_it() {
        assert_eq!(exposure(Rational { num: 1, denom: 250 }).as_deref(), Some("1/250"));
        assert_eq!(exposure(Rational { num: 10, denom: 2500 }).as_deref(), Some("1/250"));
        assert_eq!(exposure(Rational { num: 2, denom: 1 }).as_deref(), Some("2"));
        assert_eq!(exposure(Rational { num: 5, denom: 2 }).as_deref(), Some("2.5"));
        assert_eq!(exposure(Rational { num: 1, denom: 0 }), None);
        assert_eq!(exposure(Rational { num: 0, denom: 1 }), None);
    }

    #[test]
    fn not_exif_is_an_error() {
        assert!(parse(b"definitely not a TIFF structure".to_vec()).is_err());
    }
}
