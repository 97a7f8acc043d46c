//! The tree's bookkeeping: LRU sets of evictable device and host leaves, locks, and the
//! evictions of sglang `hiradix_cache.py` (`evict`, `evict_host`, `write_backup`).

use kvlayout_pool::PagePair;

use super::{NONE, Node, PageStore, Schedule, WritePolicy};
use crate::error::ReplayError;

impl Schedule {
    /// Takes node `n` out of the LRU sets (before its state or `last_access` changes).
    pub(super) fn unindex(&mut self, n: u32) {
        let node = &mut self.nodes[n as usize];
        let key = (node.last_access, n);
        if node.in_device_lru {
            node.in_device_lru = false;
            self.device_lru.remove(&key);
        }
        if node.in_host_lru {
            node.in_host_lru = false;
            self.host_lru.remove(&key);
        }
    }

    /// Puts node `n` back into the LRU sets it belongs to.
    pub(super) fn index(&mut self, n: u32) {
        let node = &mut self.nodes[n as usize];
        let key = (node.last_access, n);
        if node.lock == 0 && node.on_device && node.device_children == 0 {
            node.in_device_lru = true;
            self.device_lru.insert(key);
        }
        if node.lock == 0 && !node.on_device && node.on_host && node.children == 0 {
            node.in_host_lru = true;
            self.host_lru.insert(key);
        }
    }

    pub(super) fn lock(&mut self, n: u32) {
        self.unindex(n);
        let node = &mut self.nodes[n as usize];
        if node.lock == 0 && node.on_device {
            self.evictable_pages -= u64::from(node.pages);
        }
        node.lock += 1;
        self.index(n);
    }

    pub(super) fn unlock(&mut self, n: u32) {
        self.unindex(n);
        let node = &mut self.nodes[n as usize];
        node.lock -= 1;
        if node.lock == 0 && node.on_device {
            self.evictable_pages += u64::from(node.pages);
        }
        self.index(n);
    }

    pub(super) fn touch(&mut self, n: u32) {
        self.unindex(n);
        self.clock += 1;
        self.nodes[n as usize].last_access = self.clock;
        self.index(n);
    }

    /// Marks `n` on or off the device, keeping the parent's count and the evictable pages.
    pub(super) fn set_on_device(&mut self, n: u32, on: bool) {
        self.unindex(n);
        let node = &mut self.nodes[n as usize];
        if node.on_device == on {
            self.index(n);
            return;
        }
        node.on_device = on;
        let (pages, unlocked, parent) = (u64::from(node.pages), node.lock == 0, node.parent);
        if unlocked {
            if on {
                self.evictable_pages += pages;
            } else {
                self.evictable_pages -= pages;
            }
        }
        self.index(n);
        if parent != NONE {
            self.unindex(parent);
            let p = &mut self.nodes[parent as usize];
            if on {
                p.device_children += 1;
            } else {
                p.device_children -= 1;
            }
            self.index(parent);
        }
    }

    /// Runs the queued backups as one transfer. A refused backup leaves no host copy: its
    /// nodes lose their host pages, and a node no longer on the device is dropped.
    pub(super) fn flush_backups<S: PageStore>(&mut self, store: &mut S) -> Result<(), ReplayError> {
        if self.pending_backup.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending_backup);
        let pairs: Vec<PagePair> = pending.iter().map(|&(_, p)| p).collect();
        if store.backup(&pairs)? {
            self.counts.backed_up_pages += pairs.len() as u64;
            return Ok(());
        }
        self.counts.refused_transfers += 1;
        let mut nodes: Vec<u32> = pending.iter().map(|&(n, _)| n).collect();
        nodes.dedup();
        for n in nodes {
            self.unindex(n);
            let node = &mut self.nodes[n as usize];
            node.on_host = false;
            let (pages, host, on_device) = (node.pages as usize, node.host, node.on_device);
            self.host_free.extend_from_slice(&host[..pages]);
            if on_device {
                self.index(n);
            } else {
                self.counts.dropped_pages += pages as u64;
                self.drop_subtree(n);
            }
        }
        Ok(())
    }

    /// Frees host pages of host-only leaves, least recently used first, until `want` are free
    /// or none is left to evict (sglang `evict_host`).
    pub(super) fn evict_host<S: PageStore>(
        &mut self,
        want: u64,
        store: &mut S,
    ) -> Result<(), ReplayError> {
        // A host page queued for backup must land before it can be reused.
        self.flush_backups(store)?;
        while (self.host_free.len() as u64) < want {
            let Some(&(_, n)) = self.host_lru.iter().next() else {
                break;
            };
            self.unindex(n);
            let node = &mut self.nodes[n as usize];
            node.on_host = false;
            let pages = node.pages as usize;
            let host = node.host;
            self.host_free.extend_from_slice(&host[..pages]);
            self.counts.evicted_host_pages += pages as u64;
            self.delete_node(n);
        }
        Ok(())
    }

    /// Removes node `n` (no copy left, no children) from the tree.
    pub(super) fn delete_node(&mut self, n: u32) {
        self.unindex(n);
        let (hash, parent) = (
            self.nodes[n as usize].hash_id,
            self.nodes[n as usize].parent,
        );
        self.by_hash.remove(&hash);
        self.free_nodes.push(n);
        if parent != NONE {
            self.unindex(parent);
            self.nodes[parent as usize].children -= 1;
            self.index(parent);
        }
    }

    /// Takes `pages` host pages, evicting host-only leaves if needed; `None` when the host
    /// cannot make room.
    pub(super) fn alloc_host<S: PageStore>(
        &mut self,
        pages: usize,
        store: &mut S,
    ) -> Result<Option<[u32; 8]>, ReplayError> {
        if self.host_free.len() < pages {
            self.evict_host(pages as u64, store)?;
        }
        if self.host_free.len() < pages {
            return Ok(None);
        }
        let mut out = [0u32; 8];
        for slot in out.iter_mut().take(pages) {
            *slot = self.host_free.pop().unwrap_or(0);
        }
        Ok(Some(out))
    }

    /// Queues a backup of node `n`'s device pages; false when the host cannot take it.
    pub(super) fn write_backup<S: PageStore>(
        &mut self,
        n: u32,
        store: &mut S,
    ) -> Result<bool, ReplayError> {
        let pages = self.nodes[n as usize].pages as usize;
        let Some(host) = self.alloc_host(pages, store)? else {
            return Ok(false);
        };
        self.unindex(n);
        let node = &mut self.nodes[n as usize];
        node.host = host;
        node.on_host = true;
        for (&d, &h) in node.device.iter().zip(&host).take(pages) {
            self.pending_backup
                .push((n, PagePair::new(u64::from(d), u64::from(h))));
        }
        self.index(n);
        Ok(true)
    }

    /// Frees at least `want` device pages by evicting unlocked device leaves (sglang `evict`).
    pub(super) fn evict<S: PageStore>(
        &mut self,
        want: u64,
        store: &mut S,
    ) -> Result<(), ReplayError> {
        let mut freed_after_backup: Vec<u32> = Vec::new();
        // Dropped pages are free at once; backed-up ones once the backup has run.
        while ((self.device_free.len() + freed_after_backup.len()) as u64) < want {
            let Some(&(_, n)) = self.device_lru.iter().next() else {
                break;
            };
            let pages = self.nodes[n as usize].pages as usize;
            let backed = self.nodes[n as usize].on_host
                || (self.cfg.write_policy == WritePolicy::WriteBack
                    && self.write_backup(n, store)?);
            let device = self.nodes[n as usize].device;
            self.set_on_device(n, false);
            self.counts.evicted_device_pages += pages as u64;
            if backed {
                // Freed once the backup has copied them.
                freed_after_backup.extend_from_slice(&device[..pages]);
            } else {
                self.counts.dropped_pages += pages as u64;
                self.device_free.extend_from_slice(&device[..pages]);
                self.drop_subtree(n);
            }
        }
        self.flush_backups(store)?;
        self.device_free.extend(freed_after_backup);
        Ok(())
    }

    /// Deletes node `n` (off the device, not on the host) with its host-only descendants.
    pub(super) fn drop_subtree(&mut self, n: u32) {
        if self.nodes[n as usize].children == 0 {
            self.delete_node(n);
            return;
        }
        // Children of an evicted device leaf are all off the device.
        let children: Vec<u32> = (0..self.nodes.len() as u32)
            .filter(|&c| {
                self.nodes[c as usize].parent == n
                    && self.by_hash.get(&self.nodes[c as usize].hash_id) == Some(&c)
            })
            .collect();
        for c in children {
            if self.nodes[c as usize].on_host {
                self.unindex(c);
                let node = &mut self.nodes[c as usize];
                node.on_host = false;
                let pages = node.pages as usize;
                let host = node.host;
                self.host_free.extend_from_slice(&host[..pages]);
                self.counts.evicted_host_pages += pages as u64;
            }
            self.drop_subtree(c);
        }
        self.delete_node(n);
    }

    pub(super) fn new_node(&mut self, hash_id: u64, parent: u32, pages: u8) -> u32 {
        let node = Node {
            hash_id,
            parent,
            pages,
            children: 0,
            device_children: 0,
            lock: 0,
            last_access: 0,
            on_device: false,
            on_host: false,
            device: [0; 8],
            host: [0; 8],
            in_device_lru: false,
            in_host_lru: false,
        };
        let n = match self.free_nodes.pop() {
            Some(n) => {
                self.nodes[n as usize] = node;
                n
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.by_hash.insert(hash_id, n);
        if parent != NONE {
            self.unindex(parent);
            self.nodes[parent as usize].children += 1;
            self.index(parent);
        }
        n
    }
}
