"""Worker process runtime: actors, their message loops, and the proc's control loop."""
