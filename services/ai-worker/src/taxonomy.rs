//! Class names and search tags. `labels.json` names the model's classes in index order (the
//! bundled model's 1000 ImageNet classes; any number from [`MIN_CLASSES`] for a model of your
//! own); `tags.json`, optional, gives each class its broader names, nearest first (for the
//! bundled model its WordNet ancestors: tabby → domestic cat → cat → feline → … → animal), both
//! written by `scripts/prepare-model.sh`.
//!
//! An analysis reports the top-k classes and, as tags, those classes' names and ancestors. A
//! tag's score is the summed probability of every class it covers, so "cat" scores what all
//! the cat classes together score; tags under `tag_min_score` are left out. Without a tag table
//! the tags are the top classes' names.

use std::collections::{HashMap, HashSet};

use imagepipe_contracts::step::Prediction;

/// The fewest classes a model may have.
pub const MIN_CLASSES: usize = 2;

/// Why a label or tag table is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TaxonomyError {
    /// The file is not the JSON expected.
    #[error("not a JSON {expected}: {source}")]
    Json {
        /// What the file should hold.
        expected: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The label list names fewer than [`MIN_CLASSES`] classes.
    #[error("the label list has {actual} entries, at least {MIN_CLASSES} expected")]
    TooFewClasses {
        /// Entries found.
        actual: usize,
    },
    /// The tag table does not have one entry per class.
    #[error("the tag table has {actual} entries, expected {expected} (one per class of the label list)")]
    Length {
        /// Entries found.
        actual: usize,
        /// The number of classes.
        expected: usize,
    },
    /// A class has an empty name.
    #[error("class {0} has an empty name")]
    EmptyLabel(usize),
}

impl TaxonomyError {
    /// Whether the tag table is at fault (else the label list).
    pub fn is_about_tags(&self) -> bool {
        match self {
            Self::Json { expected, .. } => *expected == TAGS_EXPECTED,
            Self::Length { .. } => true,
            Self::TooFewClasses { .. } | Self::EmptyLabel(_) => false,
        }
    }
}

/// What the tag table should hold.
const TAGS_EXPECTED: &str = "list of ancestor lists";

/// Class names, each class's ancestor tags, and which classes each tag covers.
#[derive(Debug, Clone)]
pub struct Taxonomy {
    labels: Vec<String>,
    ancestors: Vec<Vec<String>>,
    covers: HashMap<String, Vec<usize>>,
}

impl Taxonomy {
    /// Reads `labels.json` (a list of class names, at least [`MIN_CLASSES`]) and, when there is
    /// one, `tags.json` (a list of as many lists of ancestor names); without it no class has
    /// ancestors.
    pub fn from_json(labels: &[u8], tags: Option<&[u8]>) -> Result<Self, TaxonomyError> {
        let labels: Vec<String> = serde_json::from_slice(labels)
            .map_err(|source| TaxonomyError::Json { expected: "list of class names", source })?;
        let ancestors: Vec<Vec<String>> = match tags {
            Some(tags) => serde_json::from_slice(tags)
                .map_err(|source| TaxonomyError::Json { expected: TAGS_EXPECTED, source })?,
            None => vec![Vec::new(); labels.len()],
        };
        Self::new(labels, ancestors)
    }

    /// A taxonomy of `labels` with each class's `ancestors`, nearest first.
    pub fn new(labels: Vec<String>, ancestors: Vec<Vec<String>>) -> Result<Self, TaxonomyError> {
        if labels.len() < MIN_CLASSES {
            return Err(TaxonomyError::TooFewClasses { actual: labels.len() });
        }
        if ancestors.len() != labels.len() {
            return Err(TaxonomyError::Length { actual: ancestors.len(), expected: labels.len() });
        }
        if let Some(index) = labels.iter().position(|l| l.trim().is_empty()) {
            return Err(TaxonomyError::EmptyLabel(index));
        }
        let mut covers: HashMap<String, Vec<usize>> = HashMap::new();
        for (class, (label, tags)) in labels.iter().zip(&ancestors).enumerate() {
            let mut seen = HashSet::new();
            for tag in std::iter::once(label).chain(tags) {
                if seen.insert(tag) {
                    covers.entry(tag.clone()).or_default().push(class);
                }
            }
        }
        Ok(Self { labels, ancestors, covers })
    }

    /// The number of classes.
    pub fn classes(&self) -> usize {
        self.labels.len()
    }

    /// The class names, in index order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The name of class `index`.
    pub fn label(&self, index: usize) -> &str {
        &self.labels[index]
    }

    /// The broader tags of class `index`, nearest first.
    pub fn ancestors(&self, index: usize) -> &[String] {
        &self.ancestors[index]
    }

    /// The `top_k` classes of `probabilities`, best first (ties by class index).
    pub fn top_classes(&self, probabilities: &[f32], top_k: usize) -> Vec<(usize, f32)> {
        let mut ranked: Vec<(usize, f32)> = probabilities.iter().copied().enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(top_k);
        ranked
    }

    /// The top `top_k` predictions and the tags of those classes scoring at least
    /// `tag_min_score`, both best first.
    pub fn analyze(
        &self,
        probabilities: &[f32],
        top_k: usize,
        tag_min_score: f64,
    ) -> (Vec<Prediction>, Vec<Prediction>) {
        let top = self.top_classes(probabilities, top_k);
        let predictions = top
            .iter()
            .map(|&(class, p)| Prediction { label: self.labels[class].clone(), score: f64::from(p) })
            .collect();

        let mut seen = HashSet::new();
        let mut tags: Vec<Prediction> = top
            .iter()
            .flat_map(|&(class, _)| std::iter::once(&self.labels[class]).chain(&self.ancestors[class]))
            .filter(|tag| seen.insert(tag.as_str()))
            .map(|tag| {
                let covered = &self.covers[tag.as_str()];
                let score = covered.iter().map(|&c| f64::from(probabilities[c])).sum::<f64>().min(1.0);
                Prediction { label: tag.clone(), score }
            })
            .filter(|tag| tag.score >= tag_min_score)
            .collect();
        tags.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.label.cmp(&b.label)));
        (predictions, tags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number of classes of the tests' taxonomy.
    const CLASSES: usize = 1000;

    /// Classes 0-2 are cats, 3 is a dog, 4 is espresso; the rest are filler.
    fn taxonomy() -> Taxonomy {
        let mut labels: Vec<String> = (0..CLASSES).map(|i| format!("class {i}")).collect();
        let mut ancestors = vec![Vec::new(); CLASSES];
        let cat = ["domestic cat", "cat", "feline", "carnivore", "mammal", "animal"];
        for (i, name) in ["tabby", "tiger cat", "Egyptian cat"].into_iter().enumerate() {
            labels[i] = name.into();
            ancestors[i] = cat.iter().map(|s| s.to_string()).collect();
        }
        labels[3] = "beagle".into();
        ancestors[3] = ["hound", "dog", "canine", "carnivore", "mammal", "animal"].map(String::from).to_vec();
        labels[4] = "espresso".into();
        ancestors[4] = ["coffee", "beverage", "food"].map(String::from).to_vec();
        Taxonomy::new(labels, ancestors).unwrap()
    }

    fn probabilities(pairs: &[(usize, f32)]) -> Vec<f32> {
        let mut p = vec![0.0; CLASSES];
        for &(i, v) in pairs {
            p[i] = v;
        }
        p
    }

    fn score(tags: &[Prediction], label: &str) -> Option<f64> {
        tags.iter().find(|t| t.label == label).map(|t| t.score)
    }

    #[test]
    fn predictions_are_the_top_k_best_first() {
        let p = probabilities(&[(0, 0.2), (1, 0.4), (2, 0.3), (4, 0.1)]);
        let (predictions, _) = taxonomy().analyze(&p, 2, 0.0);
        let labels: Vec<&str> = predictions.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels, ["tiger cat", "Egyptian cat"]);
        assert!((predictions[0].score - 0.4).abs() < 1e-6);
    }

    #[test]
    fn a_tag_scores_the_summed_probability_of_the_classes_it_covers() {
        let p = probabilities(&[(0, 0.2), (1, 0.4), (2, 0.3), (3, 0.05), (4, 0.05)]);
        let (_, tags) = taxonomy().analyze(&p, 3, 0.0);
        assert!((score(&tags, "cat").unwrap() - 0.9).abs() < 1e-6);
        // "animal" also covers the beagle, though it is not among the top 3.
        assert!((score(&tags, "animal").unwrap() - 0.95).abs() < 1e-6);
        assert!((score(&tags, "tabby").unwrap() - 0.2).abs() < 1e-6);
        assert_eq!(score(&tags, "dog"), None, "only the top classes' tags are reported");
        assert_eq!(tags[0].label, "animal", "best first");
        assert!(tags.windows(2).all(|w| w[0].score >= w[1].score));
        let unique: HashSet<&str> = tags.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(unique.len(), tags.len(), "deduplicated");
    }

    #[test]
    fn tags_under_the_minimum_score_are_left_out() {
        let p = probabilities(&[(4, 0.9), (3, 0.04), (0, 0.03)]);
        let (predictions, tags) = taxonomy().analyze(&p, 3, 0.05);
        assert_eq!(predictions.len(), 3);
        let labels: Vec<&str> = tags.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["beverage", "coffee", "espresso", "food", "animal", "carnivore", "mammal"]);
    }

    #[test]
    fn tables_of_the_wrong_shape_are_rejected() {
        let err = Taxonomy::from_json(b"[\"a\"]", Some(b"[[]]".as_slice())).unwrap_err();
        assert!(matches!(err, TaxonomyError::TooFewClasses { actual: 1 }), "{err}");
        let err = Taxonomy::from_json(b"[\"a\", \"b\", \"c\"]", Some(b"[[], []]".as_slice())).unwrap_err();
        assert!(matches!(err, TaxonomyError::Length { actual: 2, expected: 3 }), "{err}");
        assert!(err.to_string().contains("2 entries, expected 3"), "{err}");
        assert!(matches!(Taxonomy::from_json(b"{}", Some(b"[]".as_slice())), Err(TaxonomyError::Json { .. })));
        let labels = serde_json::to_vec(&vec![""; CLASSES]).unwrap();
        let tags = serde_json::to_vec(&vec![Vec::<String>::new(); CLASSES]).unwrap();
        assert!(matches!(Taxonomy::from_json(&labels, Some(tags.as_slice())), Err(TaxonomyError::EmptyLabel(0))));
    }

    #[test]
    fn any_number_of_classes_and_without_tags_the_tags_are_the_top_classes() {
        let taxonomy = Taxonomy::from_json(br#"["cat", "dog", "food"]"#, None).unwrap();
        assert_eq!(taxonomy.classes(), 3);
        assert_eq!(taxonomy.labels(), ["cat", "dog", "food"]);
        let (predictions, tags) = taxonomy.analyze(&[0.2, 0.7, 0.1], 2, 0.15);
        let labels: Vec<&str> = predictions.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels, ["dog", "cat"]);
        let tags: Vec<(&str, f64)> = tags.iter().map(|t| (t.label.as_str(), t.score)).collect();
        assert_eq!(tags.len(), 2);
        assert_eq!((tags[0].0, tags[1].0), ("dog", "cat"));
        assert!((tags[0].1 - 0.7).abs() < 1e-6 && (tags[1].1 - 0.2).abs() < 1e-6, "{tags:?}");
    }
}
