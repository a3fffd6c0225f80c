package verbs

import (
	"context"
	"fmt"
)

// CheckTransition reports whether ibv_modify_qp allows from -> to for an RC QP. Providers
// share it so the soft NIC refuses exactly what hardware refuses.
func CheckTransition(from, to QPState) error {
	switch to {
	case QPReset, QPErr:
		return nil
	case QPInit:
		if from == QPReset || from == QPInit {
			return nil
		}
	case QPRTR:
		if from == QPInit {
			return nil
		}
	case QPRTS:
		if from == QPRTR || from == QPRTS {
			return nil
		}
	}
	return fmt.Errorf("%w: qp transition %s -> %s", ErrInvalid, from, to)
}

// Connect walks qp through INIT, RTR and RTS towards remote, allowing remote peers the
// given access. local is this QP's own endpoint (its PSN starts the send sequence); path
// is its source GID index, hop limit and traffic class (ChooseGID).
func Connect(qp QP, port uint8, access Access, local, remote Endpoint, path Path) error {
	steps := []QPAttr{
		{State: QPInit, PortNum: port, Access: access},
		{State: QPRTR, PathMTU: min(local.MTU, remote.MTU), DestQPNum: remote.QPNum,
			RQPSN: remote.PSN, RemoteGID: remote.GID, RemoteLID: remote.LID, PortNum: port, Path: path},
		{State: QPRTS, SQPSN: local.PSN, Timeout: 14, RetryCount: 7, RNRRetry: 7},
	}
	for _, a := range steps {
		if err := qp.Modify(a); err != nil {
			return fmt.Errorf("verbs: connect qp %d to %d: %w", qp.Num(), remote.QPNum, err)
		}
	}
	return nil
}

// PollOne waits for one completion on cq, bounded by ctx.
func PollOne(ctx context.Context, cq CQ) (WorkCompletion, error) {
	var wc [1]WorkCompletion
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			return WorkCompletion{}, err
		}
		if n == 1 {
			return wc[0], nil
		}
		if err := cq.Wait(ctx); err != nil {
			return WorkCompletion{}, err
		}
	}
}

// SGEOf returns the SGE covering mr.Bytes()[off:off+n].
func SGEOf(mr MR, off, n int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}
