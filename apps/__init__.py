"""The portal's Django apps, one per concern."""
