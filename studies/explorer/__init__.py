"""The utility-weights explorer (notebook 09): :mod:`.runs` the small simulations behind the
sliders, :mod:`.plots` the figures, :mod:`.ui` the sliders."""
