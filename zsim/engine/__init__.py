"""Discrete-event engine on SimPy: resources, the simulation loop and trace records."""
