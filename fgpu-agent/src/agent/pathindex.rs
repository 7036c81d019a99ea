//! Cgroup paths indexed component by component: "which of these paths lie at or above that
//! one" in time linear in the length of the path asked about, whatever the number of paths
//! indexed or how deep they are. The budget pass asks it for every ledger and every process
//! (the ledger nested directly above a ledger, the limited cgroups above it, the ledger a
//! process belongs to), so a tenant that makes many ledgers or a deep chain of cgroups
//! costs the pass in proportion to what it made, never in its square or cube.

use std::collections::HashMap;

/// Paths with a value each.
#[derive(Debug)]
pub struct PathIndex<T> {
    nodes: Vec<Node<T>>,
}

#[derive(Debug)]
struct Node<T> {
    children: HashMap<Box<str>, usize>,
    value: Option<T>,
}

impl<T> Node<T> {
    fn new() -> Self {
        Node {
            children: HashMap::new(),
            value: None,
        }
    }
}

fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty())
}

impl<T> Default for PathIndex<T> {
    fn default() -> Self {
        PathIndex {
            nodes: vec![Node::new()],
        }
    }
}

impl<T> PathIndex<T> {
    /// Sets the value of `path` (replacing one it had).
    pub fn insert(&mut self, path: &str, value: T) {
        let mut at = 0;
        for c in components(path) {
            at = match self.nodes[at].children.get(c) {
                Some(&next) => next,
                None => {
                    let next = self.nodes.len();
                    self.nodes.push(Node::new());
                    self.nodes[at].children.insert(c.into(), next);
                    next
                }
            };
        }
        self.nodes[at].value = Some(value);
    }

    /// The values of the paths at or above `path`, the root's first, `path`'s own last.
    pub fn along(&self, path: &str) -> Vec<&T> {
        let mut out: Vec<&T> = self.nodes[0].value.iter().collect();
        let mut at = 0;
        for c in components(path) {
            match self.nodes[at].children.get(c) {
                Some(&next) => at = next,
                None => break,
            }
            out.extend(self.nodes[at].value.as_ref());
        }
        out
    }

    /// The value of the deepest path at or above `path`.
    pub fn deepest(&self, path: &str) -> Option<&T> {
        let mut found = self.nodes[0].value.as_ref();
        let mut at = 0;
        for c in components(path) {
            match self.nodes[at].children.get(c) {
                Some(&next) => at = next,
                None => break,
            }
            found = self.nodes[at].value.as_ref().or(found);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_at_or_above_a_path_are_found_like_is_under_finds_them() {
        let mut idx = PathIndex::default();
        for (i, p) in ["/pod", "/pod/a", "/pod2", "/pod/a/b/c", "/"]
            .iter()
            .enumerate()
        {
            idx.insert(p, i);
        }
        assert_eq!(idx.along("/pod/a/b/c/d"), vec![&4, &0, &1, &3]);
        assert_eq!(idx.along("/pod/a/b"), vec![&4, &0, &1]);
        assert_eq!(
            idx.along("/pod2x"),
            vec![&4],
            "a sibling with a longer name"
        );
        assert_eq!(idx.deepest("/pod/a/b"), Some(&1));
        assert_eq!(idx.deepest("/pod2/x"), Some(&2));
        assert_eq!(idx.deepest("/other"), Some(&4));
        let empty: PathIndex<u8> = PathIndex::default();
        assert_eq!(empty.deepest("/x"), None);
    }
}
