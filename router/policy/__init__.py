"""Vocabulary policies: the decision record and Policy seam (base), the built-in policies
(builtin), policy documents (spec) and building a policy from one (build)."""
