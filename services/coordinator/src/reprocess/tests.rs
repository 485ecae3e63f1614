use super::*;

fn request(json: serde_json::Value) -> ReprocessRequest {
    serde_json::from_value(json).unwrap()
}

#[test]
fn requests_default_to_missing_and_low() {
    let r = request(serde_json::json!({"from": "analyze"}));
    assert_eq!((r.select, r.priority), (Select::Missing, Priority::Low));
    assert!(serde_json::from_value::<ReprocessRequest>(serde_json::json!({"from": "download"})).is_err());
    assert!(serde_json::from_value::<ReprocessRequest>(serde_json::json!({"from": "analyze", "x": 1})).is_err());
    let running = serde_json::from_value::<ReprocessRequest>(
        serde_json::json!({"from": "analyze", "filter": {"state": "analyzing"}}),
    );
    assert!(running.is_err(), "only finished states can be named");
}
