"""The file shell: inventory snapshot files, polling files for changes."""
