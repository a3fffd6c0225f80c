import sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.SUB); s.setsockopt(zmq.RCVHWM, 1); s.setsockopt(zmq.RCVBUF, 4096)
s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(sys.argv[1]); time.sleep(float(sys.argv[2]))  # never reads
