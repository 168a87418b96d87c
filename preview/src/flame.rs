//! Flame graph trees: weighted stacks merged by function name from the
//! root down, written compactly for the page (`[name id, weight in µs,
//! [children]]`, heaviest child first).

use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Node {
    name: u32,
    weight: f64,
    children: Vec<Node>,
}

/// A flame graph of weighted stacks (weights in seconds).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flame {
    children: Vec<Node>,
    total: f64,
    samples: usize,
}

impl Flame {
    /// Adds one stack (name ids, root first) with its weight.
    pub(crate) fn add(&mut self, stack: &[u32], weight: f64) {
        self.samples += 1;
        if weight <= 0.0 {
            return;
        }
        self.total += weight;
        let mut level = &mut self.children;
        for &name in stack {
            let i = match level.iter().position(|n| n.name == name) {
                Some(i) => i,
                None => {
                    level.push(Node {
                        name,
                        weight: 0.0,
                        children: Vec::new(),
                    });
                    level.len() - 1
                }
            };
            level[i].weight += weight;
            level = &mut level[i].children;
        }
    }

    /// Total weight, in seconds.
    pub(crate) fn total(&self) -> f64 {
        self.total
    }

    /// Samples added (weighted or not).
    pub(crate) fn samples(&self) -> usize {
        self.samples
    }

    /// Weight of the nodes named `name` at any depth, counted once per
    /// path (a recursive function is not counted twice).
    pub(crate) fn weight_of(&self, name: u32) -> f64 {
        fn walk(nodes: &[Node], name: u32) -> f64 {
            nodes
                .iter()
                .map(|n| {
                    if n.name == name {
                        n.weight
                    } else {
                        walk(&n.children, name)
                    }
                })
                .sum()
        }
        walk(&self.children, name)
    }

    /// The tree as the page reads it, leaving out nodes lighter than
    /// `min_share` of the total (too narrow to see; their weight stays in
    /// their parent).
    pub(crate) fn to_json(&self, min_share: f64) -> Value {
        fn level(nodes: &[Node], min: f64) -> Value {
            let mut kept: Vec<&Node> = nodes.iter().filter(|c| c.weight >= min).collect();
            kept.sort_by(|a, b| b.weight.total_cmp(&a.weight));
            kept.into_iter()
                .map(|n| json!([n.name, micros(n.weight), level(&n.children, min)]))
                .collect()
        }
        level(&self.children, self.total * min_share)
    }
}

fn micros(seconds: f64) -> u64 {
    (seconds * 1e6).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_name_from_the_root_and_prunes_narrow_nodes() {
        let mut f = Flame::default();
        f.add(&[0, 1, 2], 0.010);
        f.add(&[0, 1, 3], 0.020);
        f.add(&[0, 4], 0.000_01);
        f.add(&[5], 0.0);
        assert_eq!(f.samples(), 4);
        assert!((f.total() - 0.030_01).abs() < 1e-9);
        assert!((f.weight_of(1) - 0.030).abs() < 1e-9);
        let v = f.to_json(0.001);
        assert_eq!(
            v,
            json!([[0, 30010, [[1, 30000, [[3, 20000, []], [2, 10000, []]]]]]])
        );
    }
}
