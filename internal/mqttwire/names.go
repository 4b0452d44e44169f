package mqttwire

import (
	"fmt"

	"github.com/mochi-mqtt/server/v2/packets"
)

// PacketName is the codec's name for packet type t ("Publish"), for
// messages.
func PacketName(t byte) string {
	if name, ok := packets.PacketNames[t]; ok {
		return name
	}
	return fmt.Sprintf("packet type %d", t)
}

// reasons are the codec's reason codes, one for each code MQTT 5 defines
// (§2.4), in the codec's words; where the codec has several for a code
// (0x81 for each field that can be malformed), the general one.
var reasons = [...]packets.Code{
	packets.CodeSuccess,
	packets.CodeGrantedQos1,
	packets.CodeGrantedQos2,
	packets.CodeDisconnectWillMessage,
	packets.CodeNoMatchingSubscribers,
	packets.CodeNoSubscriptionExisted,
	packets.CodeContinueAuthentication,
	packets.CodeReAuthenticate,
	packets.ErrUnspecifiedError,
	packets.ErrMalformedPacket,
	packets.ErrProtocolViolation,
	packets.ErrImplementationSpecificError,
	packets.ErrUnsupportedProtocolVersion,
	packets.ErrClientIdentifierNotValid,
	packets.ErrBadUsernameOrPassword,
	packets.ErrNotAuthorized,
	packets.ErrServerUnavailable,
	packets.ErrServerBusy,
	packets.ErrBanned,
	packets.ErrServerShuttingDown,
	packets.ErrBadAuthenticationMethod,
	packets.ErrKeepAliveTimeout,
	packets.ErrSessionTakenOver,
	packets.ErrTopicFilterInvalid,
	packets.ErrTopicNameInvalid,
	packets.ErrPacketIdentifierInUse,
	packets.ErrPacketIdentifierNotFound,
	packets.ErrReceiveMaximum,
	packets.ErrTopicAliasInvalid,
	packets.ErrPacketTooLarge,
	packets.ErrMessageRateTooHigh,
	packets.ErrQuotaExceeded,
	packets.ErrAdministrativeAction,
	packets.ErrPayloadFormatInvalid,
	packets.ErrRetainNotSupported,
	packets.ErrQosNotSupported,
	packets.ErrUseAnotherServer,
	packets.ErrServerMoved,
	packets.ErrSharedSubscriptionsNotSupported,
	packets.ErrConnectionRateExceeded,
	packets.ErrMaxConnectTime,
	packets.ErrSubscriptionIdentifiersNotSupported,
	packets.ErrWildcardSubscriptionsNotSupported,
}

// ReasonName says what MQTT 5 reason code code means ("packet too
// large"), for messages; 0x00 is "success", whichever packet carries it.
func ReasonName(code byte) string {
	for _, c := range reasons {
		if c.Code == code {
			return c.Reason
		}
	}
	return "unknown reason code"
}
