use std::collections::HashSet;

use super::*;
use crate::hnsw::Graph;
use crate::synthetic::{Clusters, Rng};

const V: &str = "test@1/pool";

fn embedding(features: &[f32]) -> Embedding {
    Embedding::from_features(V, features).unwrap()
}

/// A unit vector along `axis` tilted by `tilt` towards axis 1 (`dim` components).
fn tilted(dim: usize, axis: usize, tilt: f32) -> Embedding {
    let mut features = vec![0.0; dim];
    features[axis] = 1.0;
    features[1] += tilt;
    embedding(&features)
}

/// Whether `cosine` is 1 as well as f32 arithmetic gets it.
fn is_one(cosine: f32) -> bool {
    (cosine - 1.0).abs() < 1e-5
}

fn ids(hits: &[Hit]) -> Vec<&str> {
    hits.iter().map(|hit| hit.id.as_str()).collect()
}

/// The exact top `limit` by brute force over the float vectors, for comparing.
fn brute_force(items: &[(String, Embedding)], query: &Embedding, limit: usize) -> Vec<String> {
    let query = query.to_unit().unwrap();
    let mut scored: Vec<(f32, &str)> = items
        .iter()
        .map(|(id, e)| (e.to_unit().unwrap().iter().zip(&query).map(|(a, b)| a * b).sum(), id.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored.into_iter().take(limit).map(|(_, id)| id.to_owned()).collect()
}

#[test]
fn exact_search_ranks_by_cosine_and_honours_limit_and_floor() {
    let mut index = VectorIndex::new(V, 1_000);
    index.insert("x", &tilted(8, 0, 0.0)).unwrap();
    index.insert("near", &tilted(8, 0, 0.2)).unwrap();
    index.insert("farther", &tilted(8, 0, 1.0)).unwrap();
    index.insert("opposite", &embedding(&[-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])).unwrap();
    index.insert("orthogonal", &tilted(8, 5, 0.0)).unwrap();
    let query = tilted(8, 0, 0.0);

    let all = index.search(&query, 10, -1.0).unwrap();
    assert_eq!(ids(&all), ["x", "near", "farther", "orthogonal", "opposite"]);
    assert!(is_one(all[0].cosine));
    assert!((all[1].cosine - 1.0 / 1.04f32.sqrt()).abs() < 0.01, "{all:?}");
    assert!((all[2].cosine - 0.5f32.sqrt()).abs() < 0.01, "{all:?}");
    assert!(all[3].cosine.abs() < 1e-6 && all[4].cosine <= -0.99, "{all:?}");

    assert_eq!(ids(&index.search(&query, 2, -1.0).unwrap()), ["x", "near"]);
    assert_eq!(ids(&index.search(&query, 10, 0.7).unwrap()), ["x", "near", "farther"]);
    assert_eq!(ids(&index.search(&query, 10, 0.0).unwrap()), ["x", "near", "farther", "orthogonal"]);
    assert!(index.search(&query, 0, -1.0).unwrap().is_empty());
    assert!(index.search(&query, 10, 1.5).unwrap().is_empty());
}

#[test]
fn exact_search_matches_brute_force_on_signed_vectors() {
    let mut rng = Rng::new(7);
    let clusters = Clusters::new(&mut rng, 20, 64, 0.7, false);
    let items: Vec<(String, Embedding)> =
        (0..500).map(|i| (format!("img-{i:03}"), clusters.embedding(&mut rng, V))).collect();
    let mut index = VectorIndex::new(V, 10_000);
    for (id, e) in &items {
        index.insert(id, e).unwrap();
    }
    let mut negative = false;
    for _ in 0..20 {
        let query = clusters.embedding(&mut rng, V);
        let hits = index.search(&query, 15, -1.0).unwrap();
        assert_eq!(ids(&hits), brute_force(&items, &query, 15));
        assert!(hits.windows(2).all(|w| w[0].cosine >= w[1].cosine));
        negative |= index.search(&query, 500, -1.0).unwrap().iter().any(|hit| hit.cosine < -0.1);
    }
    assert!(negative, "signed vectors should give some negative cosines");
}

#[test]
fn insert_replaces_and_remove_forgets() {
    let mut index = VectorIndex::new(V, 1_000);
    assert!(index.is_empty());
    index.insert("a", &tilted(4, 0, 0.0)).unwrap();
    index.insert("b", &tilted(4, 2, 0.0)).unwrap();
    index.insert("c", &tilted(4, 3, 0.0)).unwrap();
    index.insert("a", &tilted(4, 2, 0.1)).unwrap();
    index.insert("a", &tilted(4, 2, 0.1)).unwrap();
    assert_eq!(index.len(), 3);
    let hits = index.search(&tilted(4, 2, 0.0), 10, 0.5).unwrap();
    assert_eq!(ids(&hits), ["b", "a"]);
    assert!(index.cosine_to(&tilted(4, 0, 0.0), "a").unwrap() < 0.01);

    assert!(index.remove("a"));
    assert!(!index.remove("a"));
    assert_eq!(index.len(), 2);
    assert_eq!(ids(&index.search(&tilted(4, 2, 0.0), 10, -1.0).unwrap()), ["b", "c"]);
    assert_eq!(index.cosine_to(&tilted(4, 2, 0.0), "a"), None);
    assert!(index.remove("b"));
    assert_eq!(ids(&index.search(&tilted(4, 3, 0.0), 10, -1.0).unwrap()), ["c"]);
    assert!(index.cosine_to(&tilted(4, 3, 0.0), "c").is_some_and(is_one));
    assert!(index.remove("c"));
    assert!(index.is_empty());
    assert!(index.search(&tilted(4, 3, 0.0), 10, -1.0).unwrap().is_empty());
}

#[test]
fn embeddings_of_another_version_or_dimension_or_unreadable_are_refused() {
    let mut index = VectorIndex::new(V, 1_000);
    assert_eq!(index.version(), V);
    index.insert("a", &tilted(4, 0, 0.0)).unwrap();

    let other = Embedding::from_features("other@2/pool", &[1.0, 0.0, 0.0, 0.0]).unwrap();
    let error = index.insert("b", &other).unwrap_err();
    assert!(
        matches!(&error, IndexError::Version { index, embedding } if index == V && embedding == "other@2/pool"),
        "{error}"
    );
    assert!(matches!(index.search(&other, 5, -1.0), Err(IndexError::Version { .. })));
    assert_eq!(index.cosine_to(&other, "a"), None);

    let error = index.insert("b", &tilted(5, 0, 0.0)).unwrap_err();
    assert!(matches!(error, IndexError::Dim { expected: 4, actual: 5 }), "{error}");
    assert!(matches!(index.search(&tilted(3, 0, 0.0), 5, -1.0), Err(IndexError::Dim { expected: 4, actual: 3 })));
    assert_eq!(error.to_string(), "embedding has 5 components, this index's vectors have 4");

    let mut broken = tilted(4, 0, 0.0);
    broken.i8 = "not base64!".into();
    assert!(matches!(index.insert("b", &broken), Err(IndexError::Unreadable(EmbeddingError::Base64(_)))));
    broken.i8 = "AAAAAA==".into();
    assert!(matches!(index.insert("b", &broken), Err(IndexError::Unreadable(EmbeddingError::Degenerate))));
    assert_eq!(index.len(), 1);
}

#[test]
fn similar_to_leaves_the_image_itself_out() {
    let mut index = VectorIndex::new(V, 1_000);
    index.insert("a", &tilted(4, 0, 0.0)).unwrap();
    index.insert("a-twin", &tilted(4, 0, 0.0)).unwrap();
    index.insert("a-ish", &tilted(4, 0, 0.3)).unwrap();
    index.insert("b", &tilted(4, 2, 0.0)).unwrap();
    let hits = index.similar_to("a", 10, 0.5).unwrap();
    assert_eq!(ids(&hits), ["a-twin", "a-ish"]);
    assert!(is_one(hits[0].cosine));
    assert_eq!(ids(&index.similar_to("a", 1, -1.0).unwrap()), ["a-twin"]);
    let error = index.similar_to("nobody", 10, -1.0).unwrap_err();
    assert!(matches!(&error, IndexError::UnknownId(id) if id == "nobody"), "{error}");
}

/// Recall@10 of the graph against the exact scan, over `queries` fresh points.
fn recall(graph: &VectorIndex, exact: &VectorIndex, queries: &[Embedding]) -> f64 {
    let mut found = 0;
    let mut expected = 0;
    for query in queries {
        let truth: HashSet<String> = exact.search(query, 10, -1.0).unwrap().into_iter().map(|hit| hit.id).collect();
        let approximate = graph.search(query, 10, -1.0).unwrap();
        assert!(approximate.windows(2).all(|w| w[0].cosine >= w[1].cosine));
        expected += truth.len();
        found += approximate.iter().filter(|hit| truth.contains(&hit.id)).count();
    }
    found as f64 / expected as f64
}

#[test]
fn the_graph_finds_the_exact_top_ten_at_least_95_percent_of_the_time() {
    // Non-negative like the real model's features, 100 images per cluster: many near-ties.
    let (images, dim) = (8_000, 48);
    let mut rng = Rng::new(42);
    let clusters = Clusters::new(&mut rng, images / 100, dim, 1.0, true);
    let mut graph = VectorIndex::new(V, 6_000);
    let mut exact = VectorIndex::new(V, usize::MAX);
    for image in 0..images {
        let e = clusters.embedding(&mut rng, V);
        graph.insert(&format!("img-{image}"), &e).unwrap();
        exact.insert(&format!("img-{image}"), &e).unwrap();
    }
    assert!(graph.approximate() && !exact.approximate());
    assert!(graph.memory_bytes() > exact.memory_bytes());
    let queries: Vec<Embedding> = (0..200).map(|_| clusters.embedding(&mut rng, V)).collect();
    let recall = recall(&graph, &exact, &queries);
    assert!(recall >= 0.95, "recall@10 {recall}");
}

#[test]
fn the_graph_grows_a_few_images_per_change_and_serves_once_complete() {
    let mut rng = Rng::new(5);
    let clusters = Clusters::new(&mut rng, 10, 16, 0.5, false);
    let items: Vec<(String, Embedding)> =
        (0..400).map(|i| (format!("img-{i}"), clusters.embedding(&mut rng, V))).collect();
    let mut index = VectorIndex::new(V, 300);
    for (id, e) in &items[..301] {
        index.insert(id, e).unwrap();
    }
    assert_eq!(index.graph.as_ref().map(Graph::len), Some(LINKS_PER_CHANGE));
    assert!(!index.approximate(), "scans until the graph holds every image");
    assert_eq!(ids(&index.search(&items[7].1, 1, -1.0).unwrap()), ["img-7"]);
    assert_eq!(index.catch_up(10), 301 - LINKS_PER_CHANGE - 10);
    assert_eq!(index.catch_up(usize::MAX), 0);
    assert!(index.approximate());
    for (id, e) in &items[301..] {
        index.insert(id, e).unwrap();
        assert_eq!(index.catch_up(0), 0, "once caught up, each insert links its image");
    }
    for (id, e) in &items {
        assert_eq!(index.search(e, 1, -1.0).unwrap()[0].id, *id);
    }
}

#[test]
fn removals_after_the_graph_kicks_in_leave_answers_and_reuse_slots() {
    let (images, dim) = (1_500, 16);
    let mut rng = Rng::new(3);
    let clusters = Clusters::new(&mut rng, 15, dim, 0.5, false);
    let items: Vec<(String, Embedding)> =
        (0..images).map(|i| (format!("img-{i}"), clusters.embedding(&mut rng, V))).collect();
    let mut graph = VectorIndex::new(V, 200);
    let mut exact = VectorIndex::new(V, usize::MAX);
    for (id, e) in &items {
        graph.insert(id, e).unwrap();
        exact.insert(id, e).unwrap();
    }
    assert!(graph.approximate());
    let queries: Vec<Embedding> = (0..50).map(|_| clusters.embedding(&mut rng, V)).collect();

    // Removed and inserted again unchanged, as the indexer does on every change: the slot revives.
    for (id, e) in &items[..100] {
        assert!(graph.remove(id));
        graph.insert(id, e).unwrap();
    }
    assert_eq!((graph.len(), graph.store.len(), graph.dead_count), (images, images, 0));

    // Retention: old images go, new ones take their slots over.
    let mut removed: HashSet<String> = HashSet::new();
    for (n, (id, _)) in items.iter().enumerate().skip(100).step_by(4).take(300) {
        assert!(graph.remove(id));
        exact.remove(id);
        removed.insert(id.clone());
        let (new_id, new) = (format!("new-{n}"), clusters.embedding(&mut rng, V));
        graph.insert(&new_id, &new).unwrap();
        exact.insert(&new_id, &new).unwrap();
        assert_eq!(graph.search(&new, 1, -1.0).unwrap()[0].id, new_id);
    }
    assert_eq!((graph.len(), graph.store.len(), graph.dead_count), (images, images, 0));
    for query in &queries {
        let hits = graph.search(query, 10, -1.0).unwrap();
        assert_eq!(hits.len(), 10);
        assert!(hits.iter().all(|hit| !removed.contains(&hit.id)), "{hits:?}");
    }
    assert!(recall(&graph, &exact, &queries) >= 0.95);

    // Replacing a vector: the new one is found, the old one no more.
    let (id, old) = &items[1];
    let replacement = clusters.embedding(&mut rng, V);
    graph.insert(id, &replacement).unwrap();
    exact.insert(id, &replacement).unwrap();
    assert_eq!(graph.search(&replacement, 1, -1.0).unwrap()[0].id, *id);
    assert!(graph.cosine_to(&replacement, id).is_some_and(is_one));
    assert!(graph.cosine_to(old, id).unwrap() < 0.999);
    assert_eq!(graph.len(), images);

    // Removals outpacing inserts: a tenth dead compacts the store and starts the graph over.
    let live: Vec<String> = graph.slots.keys().map(|id| id.to_string()).collect();
    let mut compacted = false;
    for (n, id) in live.iter().take(images / 3).enumerate() {
        assert!(graph.remove(id));
        exact.remove(id);
        removed.insert(id.clone());
        compacted |= graph.dead_count == 0;
        if n % 10 == 0 {
            let hits = graph.similar_to(&live[images - 1], 10, -1.0).unwrap();
            assert!(hits.iter().all(|hit| graph.slots.contains_key(hit.id.as_str())), "{hits:?}");
        }
    }
    assert!(compacted, "a third removed must have compacted the store");
    assert_eq!(graph.len(), images - images / 3);
    assert!(graph.store.len() < images && graph.dead_count * DEAD_SHARE_DIVISOR < graph.store.len());
    graph.catch_up(usize::MAX);
    assert!(graph.approximate());
    for query in &queries {
        let hits = graph.search(query, 10, -1.0).unwrap();
        assert_eq!(hits.len(), 10);
        assert!(hits.iter().all(|hit| !removed.contains(&hit.id)), "{hits:?}");
    }
    assert!(recall(&graph, &exact, &queries) >= 0.95);

    // Down to the exact limit: every live image is still found.
    let live: Vec<String> = graph.slots.keys().map(|id| id.to_string()).collect();
    for id in live.iter().skip(150) {
        graph.remove(id);
    }
    assert_eq!(graph.len(), 150);
    let all = graph.search(&queries[0], 1_000, -1.0).unwrap();
    assert_eq!(all.len(), 150);
    assert!(all.iter().all(|hit| live[..150].contains(&hit.id)));
}

#[test]
fn memory_counts_vectors_ids_and_graph() {
    let mut rng = Rng::new(9);
    let clusters = Clusters::new(&mut rng, 4, 128, 0.5, true);
    let mut index = VectorIndex::new(V, 50);
    for image in 0..100 {
        index.insert(&format!("img-{image}"), &clusters.embedding(&mut rng, V)).unwrap();
    }
    let bytes = index.memory_bytes();
    assert!(bytes >= 100 * (128 + 4 + 4 * 32), "{bytes}");
    assert!(bytes < 100 * 1_000, "{bytes}");
}
