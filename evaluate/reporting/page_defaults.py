"""The report page's defaults, which report.py's options show: apart from page.py, so that the
command's --help does not load the page's libraries."""
DEFAULT_EXAMPLES = 1     # normal and abnormal inputs shown per localizable model
DEFAULT_IMAGE_SIDE = 128  # embedded images are downscaled to at most this many pixels a side
