//! The few ISO-BMFF boxes of a HEIF file read before libheif sees it: the top-level boxes, and
//! in the `meta` box the primary item (`pitm`), each item's type (`iinf`) and the bytes each
//! item's extents claim (`iloc`). Every read is bounded by the bytes at hand; nothing is
//! allocated by what a box claims.

/// The top-level boxes of an ISO-BMFF file: (type, body). Stops at the first malformed box.
pub fn boxes(bytes: &[u8]) -> impl Iterator<Item = ([u8; 4], &[u8])> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let size = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
        let kind: [u8; 4] = rest.get(4..8)?.try_into().ok()?;
        let (header, size) = match size {
            0 => (8, rest.len()), // to the end of the file
            1 => (16, usize::try_from(u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?)).ok()?),
            n => (8, n as usize),
        };
        if size < header || size > rest.len() {
            // A truncated last box still shows its beginning (enough for `ftyp` and `meta`).
            let body = rest.get(header..)?;
            rest = &[];
            return Some((kind, body));
        }
        let body = &rest[header..size];
        rest = &rest[size..];
        Some((kind, body))
    })
}

/// What the top-level `meta` box says about the file's items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Items {
    /// The primary item's id (`pitm`).
    pub primary: Option<u32>,
    /// Each item's id and type (`iinf`, item info entries of version 2 and 3).
    pub types: Vec<(u32, [u8; 4])>,
    /// Each item's id and the bytes its extents add up to (`iloc`; none without one), an
    /// extent of length 0 (to the end of the file) counted as the whole file; an error when the
    /// `iloc` box cannot be read.
    pub claims: Result<Vec<(u32, u64)>, MalformedIloc>,
}

impl Items {
    /// The type of item `id`, when `iinf` names it.
    pub fn type_of(&self, id: u32) -> Option<[u8; 4]> {
        self.types.iter().find(|(item, _)| *item == id).map(|(_, kind)| *kind)
    }
}

/// The malformed `iloc` box: what could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the iloc box is malformed ({0})")]
pub struct MalformedIloc(pub &'static str);

/// The items of the top-level `meta` box of `bytes`; `None` without one. A `pitm` or `iinf`
/// that cannot be read leaves its part empty (libheif judges them).
pub fn items(bytes: &[u8]) -> Option<Items> {
    let (_, meta) = boxes(bytes).find(|(kind, _)| kind == b"meta")?;
    let children = meta.get(4..)?; // version and flags
    let mut items = Items { primary: None, types: Vec::new(), claims: Ok(Vec::new()) };
    for (kind, body) in boxes(children) {
        match &kind {
            b"pitm" => items.primary = primary(body),
            b"iinf" => items.types = item_types(body).unwrap_or_default(),
            b"iloc" => items.claims = claims(body, bytes.len() as u64),
            _ => {}
        }
    }
    Some(items)
}

fn primary(pitm: &[u8]) -> Option<u32> {
    match pitm.first()? {
        0 => pitm.get(4..6).map(|b| u32::from(u16::from_be_bytes([b[0], b[1]]))),
        _ => pitm.get(4..8).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
    }
}

fn item_types(iinf: &[u8]) -> Option<Vec<(u32, [u8; 4])>> {
    let skip = if *iinf.first()? == 0 { 6 } else { 8 };
    let mut types = Vec::new();
    for (kind, infe) in boxes(iinf.get(skip..)?) {
        if &kind != b"infe" {
            continue;
        }
        // infe version 2 (16-bit id) or 3 (32-bit id), then the protection index.
        let item = match infe.first()? {
            2 => infe.get(4..6).map(|b| u32::from(u16::from_be_bytes([b[0], b[1]]))).zip(infe.get(8..12)),
            3 => infe.get(4..8).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).zip(infe.get(10..14)),
            _ => None,
        };
        if let Some((id, kind)) = item {
            types.push((id, kind.try_into().ok()?));
        }
    }
    Some(types)
}

/// A cursor over a box body, reading big-endian fields of up to 8 bytes.
struct Fields<'a> {
    rest: &'a [u8],
}

impl Fields<'_> {
    fn read(&mut self, size: usize, what: &'static str) -> Result<u64, MalformedIloc> {
        let field = self.rest.get(..size).ok_or(MalformedIloc(what))?;
        self.rest = &self.rest[size..];
        Ok(field.iter().fold(0, |value, &b| value << 8 | u64::from(b)))
    }
}

/// Each item's id and the bytes its extents claim, from an `iloc` body (ISO/IEC 14496-12
/// 8.11.3, versions 0-2) of a file of `file_len` bytes.
fn claims(iloc: &[u8], file_len: u64) -> Result<Vec<(u32, u64)>, MalformedIloc> {
    let mut fields = Fields { rest: iloc };
    let version = fields.read(4, "no version")? >> 24;
    if version > 2 {
        return Err(MalformedIloc("version over 2"));
    }
    let sizes = fields.read(2, "no field sizes")?;
    let nibble = |shift: u32| (sizes >> shift & 15) as usize;
    let (offset_size, length_size, base_size) = (nibble(12), nibble(8), nibble(4));
    let index_size = if version == 0 { 0 } else { nibble(0) };
    if [offset_size, length_size, base_size, index_size].iter().any(|size| !matches!(size, 0 | 4 | 8)) {
        return Err(MalformedIloc("a field size other than 0, 4 or 8"));
    }
    let wide = if version < 2 { 2 } else { 4 };
    let count = fields.read(wide, "no item count")?;
    let mut claims = Vec::new();
    for _ in 0..count {
        let id = u32::try_from(fields.read(wide, "an item cut short")?).unwrap_or(u32::MAX);
        if version > 0 {
            fields.read(2, "an item cut short")?; // construction method
        }
        fields.read(2, "an item cut short")?; // data reference index
        fields.read(base_size, "an item cut short")?;
        let extents = fields.read(2, "an item cut short")?;
        if index_size + offset_size + length_size == 0 {
            // Extents of no bytes each: every one has length 0, the whole file.
            claims.push((id, extents.saturating_mul(file_len)));
            continue;
        }
        let mut claimed = 0u64;
        for _ in 0..extents {
            fields.read(index_size, "an extent cut short")?;
            fields.read(offset_size, "an extent cut short")?;
            let length = fields.read(length_size, "an extent cut short")?;
            claimed = claimed.saturating_add(if length == 0 { file_len } else { length });
        }
        claims.push((id, claimed));
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `iloc` body of `version` with 4-byte offsets and lengths, no base offset, and items of
    /// (id, extents as (offset, length)).
    fn iloc(version: u8, items: &[(u32, &[(u32, u32)])]) -> Vec<u8> {
        let mut body = vec![version, 0, 0, 0, 0x44, 0x00];
        let wide = |value: u32, body: &mut Vec<u8>| {
            if version < 2 {
                body.extend_from_slice(&u16::try_from(value).unwrap().to_be_bytes());
            } else {
                body.extend_from_slice(&value.to_be_bytes());
            }
        };
        wide(u32::try_from(items.len()).unwrap(), &mut body);
        for (id, extents) in items {
            wide(*id, &mut body);
            if version > 0 {
                body.extend_from_slice(&[0, 0]);
            }
            body.extend_from_slice(&[0, 0]);
            body.extend_from_slice(&u16::try_from(extents.len()).unwrap().to_be_bytes());
            for (offset, length) in *extents {
                body.extend_from_slice(&offset.to_be_bytes());
                body.extend_from_slice(&length.to_be_bytes());
            }
        }
        body
    }

    #[test]
    fn extents_add_up_per_item_in_every_version() {
        for version in 0..=2 {
            let body = iloc(version, &[(1, &[(100, 50), (150, 25)]), (2, &[(0, 10); 3]), (3, &[(7, 0)])]);
            assert_eq!(claims(&body, 1000), Ok(vec![(1, 75), (2, 30), (3, 1000)]), "version {version}");
        }
    }

    #[test]
    fn extents_written_in_no_bytes_claim_the_whole_file_each() {
        // Version 1, every field size 0: one item (id 9) of 5 extents, each the whole file.
        let body = [&[1, 0, 0, 0, 0x00, 0x00, 0, 1, 0, 9, 0, 0, 0, 0][..], &5u16.to_be_bytes()].concat();
        assert_eq!(claims(&body, 1000), Ok(vec![(9, 5000)]));
    }

    #[test]
    fn a_cut_or_odd_iloc_is_malformed() {
        let body = iloc(1, &[(1, &[(100, 50), (150, 25)])]);
        for cut in [3, 5, 7, 12, body.len() - 1] {
            assert!(claims(&body[..cut], 1000).is_err(), "cut at {cut}");
        }
        let mut odd = body.clone();
        odd[4] = 0x34; // 3-byte offsets
        assert_eq!(claims(&odd, 1000), Err(MalformedIloc("a field size other than 0, 4 or 8")));
        let mut future = body;
        future[0] = 3;
        assert_eq!(claims(&future, 1000), Err(MalformedIloc("version over 2")));
    }
}
