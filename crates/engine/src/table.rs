//! A small slot table for device objects: stable indices, slot reuse, deterministic order.

/// Slots holding objects; a removed object's index is reused by the next insert.
#[derive(Debug)]
pub(crate) struct Table<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Table<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Store `value`; the caller enforces the device limit before.
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        self.len += 1;
        if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(value);
            i
        } else {
            self.slots.push(Some(value));
            (self.slots.len() - 1) as u32
        }
    }

    pub(crate) fn get(&self, i: u32) -> Option<&T> {
        self.slots.get(i as usize).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.slots.get_mut(i as usize).and_then(Option::as_mut)
    }

    /// Every object, in index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(Option::as_ref)
    }

    /// Every object, in index order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(Option::as_mut)
    }

    pub(crate) fn remove(&mut self, i: u32) -> Option<T> {
        let v = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        self.len -= 1;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn reuses_slots() {
        let mut t = Table::default();
        let a = t.insert("a");
        let b = t.insert("b");
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get(a), None);
        let c = t.insert("c");
        assert_eq!(c, a);
        assert_eq!(t.get(b), Some(&"b"));
        assert_eq!(t.len(), 2);
        assert_eq!(t.remove(99), None);
    }
}
