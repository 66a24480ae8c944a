from eagle3conv._entry import run

run()
