//! Flame graph trees: weighted stacks merged by function name from the
//! root down, written compactly for the page (`[name id, weight in µs,
//! [children]]`, heaviest child first).

use std::collections::HashMap;

use std::fmt::Write as _;

#[derive(Debug, Clone)]
struct Node {
    name: u32,
    weight: f64,
    children: Vec<u32>,
}

/// Stands for the root as a parent.
const ROOT: u32 = u32::MAX;

/// A flame graph of weighted stacks (weights in seconds), its nodes in an
/// arena found by (parent, name).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flame {
    nodes: Vec<Node>,
    roots: Vec<u32>,
    index: HashMap<(u32, u32), u32>,
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
        let mut parent = ROOT;
        for &name in stack {
            let next = self.nodes.len() as u32;
            let i = *self.index.entry((parent, name)).or_insert(next);
            if i == next {
                self.nodes.push(Node {
                    name,
                    weight: 0.0,
                    children: Vec::new(),
                });
                match parent {
                    ROOT => self.roots.push(i),
                    p => self.nodes[p as usize].children.push(i),
                }
            }
            self.nodes[i as usize].weight += weight;
            parent = i;
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
        let mut sum = 0.0;
        let mut todo: Vec<u32> = self.roots.clone();
        while let Some(i) = todo.pop() {
            let n = &self.nodes[i as usize];
            if n.name == name {
                sum += n.weight;
            } else {
                todo.extend(&n.children);
            }
        }
        sum
    }

    /// Writes the tree as the page reads it, leaving out nodes lighter than
    /// `min_share` of the total (too narrow to see; their weight stays in
    /// their parent).
    pub(crate) fn write_json(&self, min_share: f64, out: &mut String) {
        let min = self.total * min_share;
        self.write_level(&self.roots, min, out);
    }

    fn write_level(&self, ids: &[u32], min: f64, out: &mut String) {
        let mut kept: Vec<&Node> = ids
            .iter()
            .map(|&i| &self.nodes[i as usize])
            .filter(|n| n.weight >= min)
            .collect();
        kept.sort_by(|a, b| b.weight.total_cmp(&a.weight));
        out.push('[');
        for (k, n) in kept.into_iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            let _ = write!(out, "[{},{},", n.name, micros(n.weight));
            self.write_level(&n.children, min, out);
            out.push(']');
        }
        out.push(']');
    }

    /// [`Flame::write_json`] into a new string.
    pub(crate) fn to_json(&self, min_share: f64) -> String {
        let mut out = String::new();
        self.write_json(min_share, &mut out);
        out
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
        assert_eq!(
            f.to_json(0.001),
            "[[0,30010,[[1,30000,[[3,20000,[]],[2,10000,[]]]]]]]"
        );
    }
}
