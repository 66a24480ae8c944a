from eagle3conv.console import run

run()
