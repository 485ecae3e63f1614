//! The prepared model on real photos (scikit-image's samples), run by the default runtime
//! (onnxruntime; each runtime against the numpy reference: `accuracy.rs`).

mod common;

use imagepipe_ai_worker::{AnalysisOptions, analyze};

const CATS: [&str; 5] = ["tabby", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat"];

fn settings() -> AnalysisOptions {
    AnalysisOptions { top_k: 5, tag_min_score: 0.05, max_pixels: 100_000_000 }
}

#[test]
fn chelsea_is_a_cat_and_is_tagged_cat_and_animal() {
    let (Some(dir), Some(model)) = (common::model_dir(), common::model()) else { return };
    let analysis = analyze(&model, &settings(), &common::photo(&dir, "chelsea")).unwrap();
    assert_eq!(analysis.model, "efficientnet-lite0-imagenet1k@57934424");
    assert_eq!(analysis.predictions.len(), 5);
    let top3: Vec<&str> = analysis.predictions[..3].iter().map(|p| p.label.as_str()).collect();
    assert!(top3.iter().any(|l| CATS.contains(l)), "top 3 {top3:?}");
    let tags: Vec<&str> = analysis.tags.iter().map(|t| t.label.as_str()).collect();
    for tag in ["cat", "feline", "mammal", "animal"] {
        assert!(tags.contains(&tag), "{tag} missing from {tags:?}");
    }
    let score = |label: &str| analysis.tags.iter().find(|t| t.label == label).unwrap().score;
    assert!(score("cat") > 0.8, "the cat classes together: {}", score("cat"));
    assert!(score("animal") >= score("cat"));
    assert!(analysis.tags.windows(2).all(|w| w[0].score >= w[1].score), "best first");
}

#[test]
fn coffee_is_espresso_or_a_cup() {
    let (Some(dir), Some(model)) = (common::model_dir(), common::model()) else { return };
    let analysis = analyze(&model, &settings(), &common::photo(&dir, "coffee")).unwrap();
    let top = &analysis.predictions[0];
    assert!(["espresso", "cup"].contains(&top.label.as_str()), "top 1 {top:?}");
    assert!(top.score > 0.5, "{top:?}");
    let tags: Vec<&str> = analysis.tags.iter().map(|t| t.label.as_str()).collect();
    for tag in ["coffee", "beverage", "food"] {
        assert!(tags.contains(&tag), "{tag} missing from {tags:?}");
    }
}

#[test]
fn rust_preprocessing_gives_the_references_top_labels() {
    let (Some(dir), Some(model)) = (common::model_dir(), common::model()) else { return };
    let report = common::verification(&dir);
    for name in common::PHOTOS {
        let reference = report["photos"][name]["top5"].as_array().unwrap();
        let probabilities =
            model.probabilities(model.preprocess(&common::photo(&dir, name), 100_000_000).unwrap()).unwrap();
        let top = model.taxonomy().top_classes(&probabilities, 3);
        let reference_top3: Vec<usize> = reference[..3].iter().map(|r| r["index"].as_u64().unwrap() as usize).collect();
        let ours: Vec<usize> = top.iter().map(|&(i, _)| i).collect();
        // Pillow's and the image crate's bicubic resizes differ slightly, so the preprocessed
        // inputs are close but not equal: the top 3 classes agree as a set, and each of the
        // reference's top 3 probabilities is close.
        let (mut a, mut b) = (ours.clone(), reference_top3.clone());
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "{name}: ours {ours:?}, reference {reference_top3:?}");
        for r in &reference[..3] {
            let (i, p) = (r["index"].as_u64().unwrap() as usize, r["score"].as_f64().unwrap());
            let diff = (f64::from(probabilities[i]) - p).abs();
            assert!(diff < 0.1, "{name}: {} {} vs reference {p}", r["label"], probabilities[i]);
        }
    }
}

#[test]
fn the_tag_table_climbs_wordnet() {
    let Some(model) = common::model() else { return };
    let taxonomy = model.taxonomy();
    let index = |label: &str| (0..1000).find(|&i| taxonomy.label(i) == label).unwrap();
    let in_order = |label: &str, chain: &[&str]| {
        let ancestors = taxonomy.ancestors(index(label));
        let positions: Vec<usize> = chain
            .iter()
            .map(|c| {
                ancestors.iter().position(|a| a == c).unwrap_or_else(|| panic!("{label}: no {c} in {ancestors:?}"))
            })
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{label}: {ancestors:?}");
    };
    in_order("tabby", &["cat", "feline", "carnivore", "mammal", "animal"]);
    in_order("espresso", &["coffee", "beverage", "food"]);
    in_order("golden retriever", &["dog", "canine", "carnivore", "mammal", "animal"]);
    for i in 0..1000 {
        for abstract_root in ["entity", "physical entity", "abstraction", "object", "whole"] {
            assert!(
                !taxonomy.ancestors(i).iter().any(|a| a == abstract_root),
                "{}: {abstract_root}",
                taxonomy.label(i)
            );
        }
    }
}
