use imagepipe_contracts::{SubmitTask, TraceId};

use super::*;
use crate::machine;

fn label(key: &str, value: &str) -> ListQuery {
    let label = Some(LabelFilter { key: key.into(), value: value.into() });
    ListQuery { limit: 10, label, ..ListQuery::default() }
}

#[test]
fn the_label_prefilter_never_skips_a_task_that_carries_the_label() {
    let labels = [("quote\"d", "back\\slash"), ("é", "ünï\u{1}code\nline"), ("album", "summer"), ("empty", "")];
    let submit = SubmitTask {
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..SubmitTask::url("https://example.com/winter.jpg")
    };
    let task = machine::create("tsk_pre".into(), &submit, submit.validate().unwrap(), TraceId::random(), 1).task;
    let json = encode(&task);
    for (key, value) in labels {
        let query = label(key, value);
        let listing = Listing::new(&query).unwrap();
        assert!(listing.may_match(json.as_bytes()) && listing.matches(&task), "{key}={value}");
    }
    for (key, value) in [("album", "winter"), ("albums", "summer"), ("camera", "summer"), ("quote", "d")] {
        let query = label(key, value);
        let listing = Listing::new(&query).unwrap();
        assert!(!listing.matches(&task), "{key}={value}");
    }
    let query = label("camera", "summer");
    assert!(!Listing::new(&query).unwrap().may_match(json.as_bytes()), "no such key in the record: skipped");
    assert!(Listing::new(&ListQuery::default()).unwrap().may_match(b"anything"), "no label: every task");
}
