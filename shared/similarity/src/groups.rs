//! [`groups`]: near-duplicate pairs joined into groups (connected components, by union-find).

use std::collections::HashMap;

/// The connected components of the graph whose edges are `edges`: ids joined directly or
/// through others. Each group is sorted by id and the groups by their first id; only ids on an
/// edge appear, and no group has fewer than two.
pub fn groups(edges: impl IntoIterator<Item = (String, String)>) -> Vec<Vec<String>> {
    let mut sets = Sets::default();
    for (a, b) in edges {
        let (a, b) = (sets.node(a), sets.node(b));
        sets.union(a, b);
    }
    let mut components: HashMap<usize, Vec<String>> = HashMap::new();
    let ids = std::mem::take(&mut sets.ids);
    for (node, id) in ids.into_iter().enumerate() {
        components.entry(sets.root(node)).or_default().push(id);
    }
    let mut groups: Vec<Vec<String>> = components.into_values().filter(|group| group.len() > 1).collect();
    for group in &mut groups {
        group.sort_unstable();
    }
    groups.sort_unstable_by(|a, b| a[0].cmp(&b[0]));
    groups
}

/// Disjoint sets of ids, by union by size with path halving.
#[derive(Default)]
struct Sets {
    ids: Vec<String>,
    nodes: HashMap<String, usize>,
    parent: Vec<usize>,
    size: Vec<usize>,
}

impl Sets {
    fn node(&mut self, id: String) -> usize {
        if let Some(&node) = self.nodes.get(&id) {
            return node;
        }
        let node = self.ids.len();
        self.nodes.insert(id.clone(), node);
        self.ids.push(id);
        self.parent.push(node);
        self.size.push(1);
        node
    }

    fn root(&mut self, mut node: usize) -> usize {
        while self.parent[node] != node {
            self.parent[node] = self.parent[self.parent[node]];
            node = self.parent[node];
        }
        node
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        if a == b {
            return;
        }
        let (big, small) = if self.size[a] >= self.size[b] { (a, b) } else { (b, a) };
        self.parent[small] = big;
        self.size[big] += self.size[small];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|&(a, b)| (a.to_owned(), b.to_owned())).collect()
    }

    #[test]
    fn groups_join_transitively_and_sort() {
        let found =
            groups(edges(&[("e", "d"), ("c", "a"), ("x", "y"), ("b", "c"), ("d", "f"), ("a", "b"), ("y", "x")]));
        assert_eq!(found, vec![vec!["a", "b", "c"], vec!["d", "e", "f"], vec!["x", "y"]]);
        let chain = groups(edges(&[("1", "2"), ("3", "4"), ("2", "3")]));
        assert_eq!(chain, vec![vec!["1", "2", "3", "4"]]);
    }

    #[test]
    fn groups_leave_out_lone_ids() {
        assert!(groups(Vec::new()).is_empty());
        assert!(groups(edges(&[("a", "a")])).is_empty());
        assert_eq!(groups(edges(&[("a", "a"), ("b", "c")])), vec![vec!["b", "c"]]);
    }
}
