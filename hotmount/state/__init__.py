"""What the engine owns on disk: the crash-safe ledger, and the claim rules that
give one physical device one holder."""
