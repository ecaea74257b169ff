//! A place for what a policy's consumer derives from it once per policy version (the engine's
//! CEL bindings of static attestors, which verification functions the expressions call, …),
//! so that such work is not repeated per request.

use std::any::Any;
use std::sync::{Arc, OnceLock};

/// Data derived from the [`CompiledPolicy`](crate::CompiledPolicy) that holds it, computed on
/// first use. A clone starts empty: autogen variants and policies changed field by field are
/// clones, and must never carry facts derived from another policy's fields. A policy is not
/// changed once it is served, so facts derived from it stay true for its whole life.
#[derive(Default)]
pub struct DerivedSlot(OnceLock<Arc<dyn Any + Send + Sync>>);

impl DerivedSlot {
    /// The value of type `T` kept here, made by `init` on first use. `None` when another type
    /// was kept first (one consumer per policy is expected): the caller then derives its value
    /// without keeping it.
    pub fn get_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<Arc<T>> {
        let kept = self.0.get_or_init(|| Arc::new(init()));
        Arc::clone(kept).downcast().ok()
    }
}

impl Clone for DerivedSlot {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for DerivedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DerivedSlot")
            .field("derived", &self.0.get().is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_starts_empty_and_a_value_is_made_once() {
        let slot = DerivedSlot::default();
        let mut made = 0;
        let mut make = |value: u32| {
            made += 1;
            value
        };
        assert_eq!(slot.get_or_init(|| make(7)).as_deref(), Some(&7));
        assert_eq!(slot.get_or_init(|| make(8)).as_deref(), Some(&7));
        assert_eq!(made, 1);
        let clone = slot.clone();
        assert_eq!(clone.get_or_init(|| 9_u32).as_deref(), Some(&9));
        // Another type than the one kept: not kept, and the caller is told.
        assert_eq!(slot.get_or_init(|| "other").as_deref(), None);
    }
}
